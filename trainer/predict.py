"""`python -m trainer.predict RUN_DIR input=PATH [output=FILE] [overwrite=true] [overrides]`:
a trained run's model over new inputs, on any number of devices.

The run's config is composed again as `trainer.evaluate` composes it (so `devices=3`,
`accelerator=cpu` or `checkpoint=last` may be added), its strategy, data source and model
are built as training built them, the chosen checkpoint is loaded (checked against its hash),
and every input example goes through the run's own preprocessing (decode and resize of an
image folder's files, the source's resize and scale of arrays) once, in input order.

What the model takes and its classes' names come from `RUN_DIR/model_inputs.json`, written by
the run (`trainer.run.prepare.inputs`): the classes are named as training knew them, whatever became
of the training folder since, and arrays are checked against one example's shape and dtype
before TensorFlow starts (flat rows, a CSV's, reshaped to it where the sizes match; values
cast to its dtype where none changes). A run from before that file uses its source built
again, whose data must be the data it trained on.

Inputs, by the run's kind:
- a run on an image folder: a folder of images (searched recursively, sorted by path), or
  one image file; from Python also a list of image paths (in the order given);
- any other run: a `.npy` file (examples on the first axis, the same raw values the run's
  source gave), a `.npz` file (one array; or one array per named input of a model with
  several inputs), or a `.csv` file of numbers (one example per row; a header row is
  skipped); from Python also a NumPy array or a dict of arrays.

Output: a CSV file (default `RUN_DIR/predictions.csv`: `index`, `input` (the file, for
images), and for a classifier `class`, `class_name` where the run knows the names, then one
`p_<class>` column per class; otherwise one `output_<i>` column per output value), or a
`.npy` file of the raw outputs; a model with several outputs writes `.npz` (one array per
output, named as the model names its outputs). An existing file is replaced only with
`overwrite=true`, and never the input itself; the file is written under a temporary name and
renamed, and a failure leaves nothing behind. An output at a URL (`output=s3://bucket/p.csv`)
is written here, then put there whole. NaN or Inf in the inputs or the outputs is one
line naming the rows (counted from 0, as `index`), nothing written. Prints where it wrote
and how many rows; exit 2 on bad input, with one line naming the file, the array or the row
and what the model takes. A run that did not finish (no summary) is used with a warning line
saying where it stopped and which epoch's weights the checkpoint holds.

`trainer.predict(RUN_DIR, "input.npy")` is the same in Python (this module is callable).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import sys
import types
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from trainer.config.errors import ConfigError
from trainer.config.given import holding
from trainer.config.messages import one_line
from trainer.config.outcome import as_overrides, kind_of, one_error
from trainer.run import process
from trainer.run.prepare.inputs import conform, describe, non_finite, rows
from trainer.run.prepare.place import RunPlace, deliver, is_url, output_at, reading, written
from trainer.run.prepare.reopen import Reopened, reopen, take_option, unfinished

process.quiet_logs()
IMAGES = (".jpg", ".jpeg", ".png", ".gif", ".bmp")
ARRAYS = (".npy", ".npz", ".csv")
OUTPUTS = (".csv", ".npy", ".npz")


def predict_run(run_dir: str | Path, input: Any, output: str | Path | None = None,
                overrides: list[str] = (), overwrite: bool = False) -> dict[str, Any]:
    """Runs a trained run's model over `input` and writes the predictions.

    Args:
        run_dir: a run directory written by `python -m trainer`.
        input: what to predict on (see the module docstring): a path; from Python also a
            list of image paths, a NumPy array or a dict of arrays.
        output: where the predictions go (`.csv`, `.npy`; `.npz` for several outputs);
            `RUN_DIR/predictions.csv` when None. An existing file is replaced only with
            `overwrite` (never the input itself).
        overrides: `key=value` changes to the run's config, e.g. `devices=3`,
            `checkpoint=last`; `overwrite=true` as on the command line.
        overwrite: replace an existing output file.

    Returns:
        `{"output": path, "rows": n, "checkpoint": path, "replicas": n}`.

    Raises:
        ConfigError: a missing or mismatched input, NaN or Inf in it or in the outputs, an
            output that exists or cannot be written, a damaged checkpoint; one line each.
    """
    flag, rest = take_option("overwrite", None, list(overrides))
    overwrite = overwrite or _true(flag)
    with reading(run_dir) as here:  # a URL: a local copy of its run, removed after
        if output is None:  # into the run directory (at its URL too)
            found = _predict(here, input, here.root / "predictions.csv", rest, overwrite)
            found["output"] = deliver(run_dir, Path(found["output"]), "predictions.csv")
            return found
        with output_at(output, overwrite) as local:  # a URL: written here, then put there
            found = _predict(here, input, local, rest, overwrite)
    if is_url(output):
        found["output"] = str(output)
    return found


def _predict(place: RunPlace, input: Any, output: Path, rest: list[str],
             overwrite: bool) -> dict[str, Any]:
    """`predict_run` once the run is readable here (`place`) and `output` is a local file;
    the checkpoint is named as the user named the run (its URL)."""
    opened = reopen(place.root, rest)
    names, inputs, where = _read_input(input, opened.images)
    check_output(output, input, overwrite)
    kept = (opened.inputs or {}).get("examples")
    if kept is not None and not opened.images:
        inputs = conform(inputs, kept, where)  # before TensorFlow starts
    note = unfinished(opened)
    if note is not None:
        print(f"warning: {note}", file=sys.stderr, flush=True)
    process.start_tensorflow()
    # an entry point: the run's build modules import TensorFlow, started quietly by now
    from trainer.run.assembly.restore import predict_outputs, restore_run

    restored = restore_run(opened, same_data=opened.inputs is None)
    source = restored.run.data.source
    if not opened.images:
        inputs = conform(inputs, kept or describe(source)["examples"], where)
        names = [str(i) for i in range(_count(inputs))]
    outputs = predict_outputs(restored.run, inputs, len(names))
    bad = non_finite(outputs)
    if len(bad):
        which = [names[i] for i in bad] if opened.images else bad
        raise ConfigError(f"the model's outputs hold NaN or Inf for {rows(which, len(names))}; "
                          f"nothing written: look at those inputs, or predict with the other "
                          "checkpoint (checkpoint=best|last)")
    _write(output, names, outputs, _classes(opened, source), opened.images, overwrite,
           output_names(restored.run.model, outputs))
    return {"output": str(output), "rows": len(names),
            "checkpoint": place.shown(str(restored.checkpoint)),
            "replicas": restored.replicas}


def _true(flag: str | None) -> bool:
    if flag is None or flag.lower() == "false":
        return False
    if flag.lower() == "true":
        return True
    raise ConfigError(f"overwrite must be true or false; received: {flag!r}")


def _count(inputs: Any) -> int:
    first = (next(iter(inputs.values())) if isinstance(inputs, Mapping) else
             inputs[0] if isinstance(inputs, tuple) else inputs)
    return len(first)


def _classes(opened: Reopened, source: Any) -> tuple[int | None, list[str] | None]:
    """The classes' count and names as the run recorded them (a class folder renamed since
    changes nothing); a run from before the record: its source's, built again."""
    if opened.inputs is not None:
        return opened.inputs.get("num_classes"), opened.inputs.get("class_names")
    return source.num_classes, source.class_names


def check_output(output: Path, given: Any, overwrite: bool) -> None:
    """Refuses, before anything runs, an output that is a directory, under a file, in a
    read-only place, the input itself, or a file that exists without `overwrite`."""
    if output.is_dir():
        raise ConfigError(f"output={output} is a directory; name a file in it, e.g. "
                          f"output={output / 'predictions.csv'}")
    if output.suffix not in OUTPUTS:
        raise ConfigError(f"output={output} must end in {', '.join(OUTPUTS)}")
    for parent in output.parents:
        if not parent.exists() and not parent.is_symlink():
            continue
        if not parent.is_dir():
            raise ConfigError(f"output={output} cannot be written: {parent} is a file, not a "
                              "directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(f"output={output} cannot be written: {parent} is read-only for "
                              "this user")
        break
    if not output.exists():
        return
    paths = (given if isinstance(given, (list, tuple)) else [given])
    for path in paths:
        if isinstance(path, (str, os.PathLike)) and _same_file(output, Path(path)):
            raise ConfigError(f"output={output} is the input file; predictions never replace "
                              "their input: name another output=")
    if not overwrite:
        raise ConfigError(f"output={output} exists; pass overwrite=true to replace it, or "
                          "name another output=")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _read_input(given: Any, images: bool) -> tuple[list[str], Any, str]:
    """(a name per example, the examples: image paths, or an array / dict of arrays, and
    how messages name them)."""
    if isinstance(given, (str, os.PathLike)):
        return _read_path(Path(given), images)
    if images:
        if isinstance(given, (list, tuple)) and given and all(
                isinstance(p, (str, os.PathLike)) for p in given):
            return _image_files([Path(p) for p in given])
        raise ConfigError("this run was trained on an image folder: input is a folder of "
                          "images or an image file (from Python also a list of image paths); "
                          f"received {kind_of(given)}")
    if isinstance(given, np.ndarray):
        return [], given, "input (the array given)"
    if isinstance(given, Mapping) and given and all(isinstance(v, np.ndarray)
                                                    for v in given.values()):
        return [], {str(k): v for k, v in given.items()}, "input (the dict given)"
    raise ConfigError("input is a .npy, .npz or .csv file, or from Python a NumPy array or a "
                      f"dict of them (one per named input); received {kind_of(given)}")


def _image_files(files: list[Path]) -> tuple[list[str], list[str], str]:
    for file in files:
        if not file.is_file():
            raise ConfigError(f"input: {file} is not a file; pass image files "
                              f"({', '.join(IMAGES)})")
        if file.suffix.lower() not in IMAGES:
            raise ConfigError(f"input: {file} is not an image ({', '.join(IMAGES)}); this run "
                              "was trained on an image folder")
    return [str(f) for f in files], [str(f) for f in files], "input"


def _read_path(path: Path, images: bool) -> tuple[list[str], Any, str]:
    where = f"input={path}"
    if not path.exists():
        raise ConfigError(f"{where} does not exist; pass "
                          + ("a folder of images or an image file" if images
                             else "a .npy, .npz or .csv file of examples"))
    if images:
        files = ([path] if path.is_file() else
                 sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGES and p.is_file()))
        if not files or files[0].suffix.lower() not in IMAGES:
            raise ConfigError(f"{where} holds no images ({', '.join(IMAGES)}); this run "
                              "was trained on an image folder")
        return [str(f) for f in files], [str(f) for f in files], where
    if path.is_dir() or path.suffix.lower() not in ARRAYS:
        raise ConfigError(f"{where} is not a .npy, .npz or .csv file; this run was "
                          "trained on arrays, not an image folder")
    try:
        if path.suffix.lower() == ".npy":
            data: Any = np.load(path, allow_pickle=False)
        elif path.suffix.lower() == ".npz":
            with np.load(path, allow_pickle=False) as saved:
                data = {k: saved[k] for k in saved.files}
        else:
            data = _read_csv(path)
    except ConfigError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        # a zero-byte or cut-off .npy is NumPy's EOFError, a damaged .npz a BadZipFile
        empty = " (an empty file)" if path.stat().st_size == 0 else ""
        raise ConfigError(f"{where} cannot be read as a {path.suffix.lower()} file{empty}: "
                          f"{one_line(error) or type(error).__name__}") from None
    return [], data, where


def _read_csv(path: Path) -> np.ndarray:
    """One example per line, numbers only (a header line skipped); a ragged line or a cell
    that is not a number is named by its line."""
    with open(path, newline="") as f:
        lines = [(number, row) for number, row in enumerate(csv.reader(f), 1) if row]
    try:
        float(lines[0][1][0])
    except (ValueError, IndexError):
        lines = lines[1:]  # a header
    if not lines:
        raise ConfigError(f"input={path} holds no examples (one per line)")
    first, width = lines[0][0], len(lines[0][1])
    values = np.empty((len(lines), width))
    for i, (number, row) in enumerate(lines):
        if len(row) != width:
            raise ConfigError(f"input={path} line {number} has {len(row)} values, line "
                              f"{first} has {width}: one example per line, all of one size")
        try:
            values[i] = row
        except ValueError:
            cell = next(c for c, v in enumerate(row) if not _number(v))
            raise ConfigError(f"input={path} line {number}, column {cell + 1}: "
                              f"{row[cell]!r} is not a number") from None
    return values


def _number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def output_names(model: Any, outputs: Any) -> list[str]:
    """A name per output of a model with several (a list of them): the model's own
    (`keras.Model(inputs, [label, score])` names them by their layers), else `output_<i>`."""
    count = len(outputs) if isinstance(outputs, (list, tuple)) else 0
    names = [str(n) for n in (getattr(model, "output_names", None) or [])]
    if len(names) == count and len(set(names)) == count:
        return names
    return [f"output_{i}" for i in range(count)]


def _write(output: Path, names: list[str], outputs: Any, classes: tuple, images: bool,
           overwrite: bool, output_keys: list[str] = ()) -> None:
    """Writes the predictions atomically (a temporary name, then renamed); on a failure
    nothing is left: neither the temporary file nor a folder made for it."""
    made = [p for p in reversed(output.parents) if not p.exists()]
    try:
        with written(output) as tmp:  # the one writer: a temporary name, renamed
            _write_file(tmp, output.suffix, names, outputs, classes, images, output_keys)
            if output.exists() and not overwrite:  # appeared meanwhile
                raise ConfigError(f"output={output} exists; pass overwrite=true to replace "
                                  "it, or name another output=")
    except OSError as error:
        raise ConfigError(f"output={output} cannot be written ({error.strerror or error}); "
                          "nothing was written") from None
    finally:
        if not output.exists():
            for folder in reversed(made):
                with contextlib.suppress(OSError):
                    folder.rmdir()


def _write_file(path: Path, suffix: str, names: list[str], outputs: Any, classes: tuple,
                images: bool, output_keys: list[str] = ()) -> None:
    if isinstance(outputs, (dict, list, tuple)):
        keys = list(output_keys) or [f"output_{i}" for i in range(len(outputs))]
        named = outputs if isinstance(outputs, dict) else dict(zip(keys, outputs, strict=True))
        if suffix != ".npz":
            raise ConfigError(f"the model has {len(named)} outputs; pass output=FILE.npz")
        with open(path, "wb") as f:
            np.savez(f, **{k: np.asarray(v) for k, v in named.items()})
    elif suffix == ".npy":
        with open(path, "wb") as f:
            np.save(f, np.asarray(outputs))
    elif suffix == ".npz":
        with open(path, "wb") as f:
            np.savez(f, output=np.asarray(outputs))
    else:
        _write_csv(path, names, np.asarray(outputs), classes, images)


def _write_csv(path: Path, names: list[str], outputs: np.ndarray, classes: tuple,
               images: bool) -> None:
    flat = outputs.reshape(len(names), -1)
    count, class_names = classes
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        head = ["index"] + (["input"] if images else [])
        if count is not None and flat.shape[1] == count:
            labels = class_names or [str(i) for i in range(count)]
            writer.writerow(head + ["class"] + (["class_name"] if class_names else [])
                            + [f"p_{c}" for c in labels])
            for i, (name, row) in enumerate(zip(names, flat, strict=True)):
                best = int(np.argmax(row))
                writer.writerow([i] + ([name] if images else []) + [best]
                                + ([labels[best]] if class_names else [])
                                + [repr(float(p)) for p in row])
            return
        writer.writerow(head + [f"output_{j}" for j in range(flat.shape[1])])
        for i, (name, row) in enumerate(zip(names, flat, strict=True)):
            writer.writerow([i] + ([name] if images else []) + [repr(float(v)) for v in row])


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    args = sys.argv[1:] if argv is None else argv
    if not args or "=" in args[0]:
        print("error: usage: python -m trainer.predict RUN_DIR input=PATH [output=FILE] "
              f"[key=value ...]; received {' '.join(args) or 'nothing'}", file=sys.stderr)
        return 2
    sys.path.insert(0, os.getcwd())  # the user's own modules, as for training
    given, rest = take_option("input", None, args[1:])
    output, rest = take_option("output", None, rest)
    if given is None:
        print("error: input=PATH is missing: a folder of images, or a .npy, .npz or .csv "
              "file of examples", file=sys.stderr)
        return 2
    # started by predict_run after its own checks (the input, the output, the run)
    found = process.guarded(lambda: predict_run(args[0], given, output, rest), start=False)
    if isinstance(found, int):
        return found
    print(json.dumps(found, indent=2))
    return 0


class _Callable(types.ModuleType):
    """`trainer.predict(...)`: the module, callable as the Python API's prediction."""

    def __call__(self, run_dir: str | Path, input: Any, output: str | Path | None = None,
                 overrides: list[str] = (), overwrite: bool = False, *, model: Any = None,
                 data: Any = None) -> dict[str, Any]:
        with one_error(), holding(model=model, data=data, batch_from_data=True):
            return predict_run(run_dir, input, output,
                               as_overrides(overrides, "trainer.predict"), overwrite)


sys.modules[__name__].__class__ = _Callable

if __name__ == "__main__":
    raise SystemExit(main())
