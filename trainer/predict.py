"""`python -m trainer.predict RUN_DIR input=PATH [output=FILE] [overrides]`: a trained run's
model over new inputs, on any number of devices.

The run's config is composed again as `trainer.evaluate` composes it (so `devices=3`,
`accelerator=cpu` or `checkpoint=last` may be added), its strategy, data source and model
are built as training built them, the chosen checkpoint is loaded (checked against its hash),
and every input example goes through the run's own preprocessing (decode and resize of an
image folder's files, the source's resize and scale of arrays) once, in input order.

Inputs, by the run's kind:
- a run on an image folder: a folder of images (searched recursively, sorted by path), or
  one image file;
- any other run: a `.npy` file (examples on the first axis, the same raw values the run's
  source gave), a `.npz` file (one array; or one array per named input of a model with
  several inputs), or a `.csv` file of numbers (one example per row; a header row is
  skipped).

Output: a CSV file (default `RUN_DIR/predictions.csv`: `index`, `input` (the file, for
images), and for a classifier `class`, `class_name` where the run knows the names, then one
`p_<class>` column per class; otherwise one `output_<i>` column per output value), or a
`.npy` file of the raw outputs. Prints where it wrote and how many rows; exit 2 on bad input.
A model with several outputs writes `.npz` (one array per output).

`trainer.predict(RUN_DIR, "input.npy")` is the same in Python (this module is callable).
"""

from __future__ import annotations

import csv
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np

from trainer.config.errors import ConfigError
from trainer.config.messages import one_line
from trainer.config.outcome import one_error
from trainer.run import process
from trainer.run.reopen import reopen, take_option

process.quiet_logs()
IMAGES = (".jpg", ".jpeg", ".png", ".gif", ".bmp")
ARRAYS = (".npy", ".npz", ".csv")
OUTPUTS = (".csv", ".npy", ".npz")


def predict_run(run_dir: str | Path, input: str | Path, output: str | Path | None = None,
                overrides: list[str] = ()) -> dict[str, Any]:
    """Runs a trained run's model over `input` and writes the predictions.

    Args:
        run_dir: a run directory written by `python -m trainer`.
        input: what to predict on (see the module docstring).
        output: where the predictions go (`.csv`, `.npy`; `.npz` for several outputs);
            `RUN_DIR/predictions.csv` when None.
        overrides: `key=value` changes to the run's config, e.g. `devices=3`,
            `checkpoint=last`.

    Returns:
        `{"output": path, "rows": n, "checkpoint": path, "replicas": n}`.

    Raises:
        ConfigError: a missing or mismatched input, an unknown output format, a damaged
            checkpoint; one line each.
    """
    run_dir = Path(run_dir)
    output = Path(output) if output is not None else run_dir / "predictions.csv"
    if output.suffix not in OUTPUTS:
        raise ConfigError(f"output={output} must end in {', '.join(OUTPUTS)}")
    opened = reopen(run_dir, list(overrides))
    names, inputs = _read_input(Path(input), opened.images)
    # an entry point: the run's build modules import TensorFlow, started quietly by now
    from trainer.run.restore import predict_outputs, restore_run

    restored = restore_run(opened)
    outputs = predict_outputs(restored.run, inputs, len(names))
    _write(output, names, outputs, restored.run.data.source, opened.images)
    return {"output": str(output), "rows": len(names), "checkpoint": str(restored.checkpoint),
            "replicas": restored.replicas}


def _read_input(path: Path, images: bool) -> tuple[list[str], Any]:
    """(a name per example, the examples: image paths or an array / dict of arrays)."""
    if not path.exists():
        raise ConfigError(f"input={path} does not exist; pass "
                          + ("a folder of images or an image file" if images
                             else "a .npy, .npz or .csv file of examples"))
    if images:
        files = ([path] if path.is_file() else
                 sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGES and p.is_file()))
        if not files or files[0].suffix.lower() not in IMAGES:
            raise ConfigError(f"input={path} holds no images ({', '.join(IMAGES)}); this run "
                              "was trained on an image folder")
        return [str(f) for f in files], [str(f) for f in files]
    if path.is_dir() or path.suffix.lower() not in ARRAYS:
        raise ConfigError(f"input={path} is not a .npy, .npz or .csv file; this run was "
                          "trained on arrays, not an image folder")
    try:
        if path.suffix.lower() == ".npy":
            data: Any = np.load(path, allow_pickle=False)
        elif path.suffix.lower() == ".npz":
            with np.load(path, allow_pickle=False) as saved:
                data = {k: saved[k] for k in saved.files}
            data = next(iter(data.values())) if len(data) == 1 else data
        else:
            data = _read_csv(path)
    except (OSError, ValueError) as error:
        raise ConfigError(f"input={path} cannot be read ({one_line(error)})") from None
    first = next(iter(data.values())) if isinstance(data, dict) else data
    if np.ndim(first) == 0 or len(first) == 0:
        raise ConfigError(f"input={path} holds no examples (examples go on the first axis)")
    return [str(i) for i in range(len(first))], data


def _read_csv(path: Path) -> np.ndarray:
    with open(path, newline="") as f:
        rows = [row for row in csv.reader(f) if row]
    try:
        float(rows[0][0])
    except (ValueError, IndexError):
        rows = rows[1:]  # a header
    return np.asarray(rows, dtype=np.float32)


def _write(output: Path, names: list[str], outputs: Any, source: Any, images: bool) -> None:
    """Writes the predictions atomically (a temporary name, then renamed)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".tmp-{output.name}")
    if isinstance(outputs, dict) or isinstance(outputs, (list, tuple)):
        named = outputs if isinstance(outputs, dict) else {
            f"output_{i}": o for i, o in enumerate(outputs)}
        if output.suffix != ".npz":
            raise ConfigError(f"the model has {len(named)} outputs; pass output=FILE.npz")
        with open(tmp, "wb") as f:
            np.savez(f, **{k: np.asarray(v) for k, v in named.items()})
    elif output.suffix == ".npy":
        with open(tmp, "wb") as f:
            np.save(f, np.asarray(outputs))
    elif output.suffix == ".npz":
        with open(tmp, "wb") as f:
            np.savez(f, output=np.asarray(outputs))
    else:
        _write_csv(tmp, names, np.asarray(outputs), source, images)
    os.replace(tmp, output)


def _write_csv(path: Path, names: list[str], outputs: np.ndarray, source: Any,
               images: bool) -> None:
    flat = outputs.reshape(len(names), -1)
    classes = source.num_classes
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        head = ["index"] + (["input"] if images else [])
        if classes is not None and flat.shape[1] == classes:
            labels = source.class_names or [str(i) for i in range(classes)]
            writer.writerow(head + ["class"] + (["class_name"] if source.class_names else [])
                            + [f"p_{c}" for c in labels])
            for i, (name, row) in enumerate(zip(names, flat, strict=True)):
                best = int(np.argmax(row))
                writer.writerow([i] + ([name] if images else []) + [best]
                                + ([labels[best]] if source.class_names else [])
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
    found = process.guarded(lambda: predict_run(args[0], given, output, rest))
    if isinstance(found, int):
        return found
    print(json.dumps(found, indent=2))
    return 0


class _Callable(types.ModuleType):
    """`trainer.predict(...)`: the module, callable as the Python API's prediction."""

    def __call__(self, run_dir: str | Path, input: str | Path, output: str | Path | None = None,
                 overrides: list[str] = ()) -> dict[str, Any]:
        with one_error():
            process.start_tensorflow()
            return predict_run(run_dir, input, output, list(overrides))


sys.modules[__name__].__class__ = _Callable

if __name__ == "__main__":
    raise SystemExit(main())
