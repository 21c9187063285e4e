"""What a run's model takes, kept in the run directory, and new inputs checked against it.

`RUN_DIR/model_inputs.json` (written by the chief as training starts, once the run's data is
checked, atomically) holds the shape and dtype of one example as the run's source gives it,
before its preprocessing (`examples`: a file path for an image folder, `[8, 8, 1]` `uint8`
for the digits), the shape the model sees after it (`model`), and the classes' names and
count. `trainer.predict` reads it: the classes are named as training knew them whatever
became of the training folder since (a class folder renamed), and inputs of the wrong shape
or dtype are refused in one line naming the file, the array or the row, and what the model
takes, before TensorFlow starts. A run from before the file falls back to the source built
again (`describe`).

A decide module: NumPy, no TensorFlow (a tf.data element spec is read through its `shape`
and `dtype` attributes alone).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from trainer.config.errors import ConfigError
from trainer.rundir.atomic import write_json
from trainer.rundir.layout import RunDir

# Rows a message lists before it counts the rest.
SHOWN = 10


def describe(source: Any) -> dict[str, Any]:
    """A source's examples and classes, as `model_inputs.json` holds them."""
    shape = source.input_shape
    return {"examples": _spec(source.train.element_spec[0]),
            "model": ({k: None if v is None else list(v) for k, v in shape.items()}
                      if isinstance(shape, Mapping)
                      else list(shape)),
            "class_names": None if source.class_names is None else list(source.class_names),
            "num_classes": source.num_classes, "num_outputs": source.num_outputs}


def _spec(spec: Any) -> Any:
    if isinstance(spec, Mapping):
        return {str(k): _spec(v) for k, v in spec.items()}
    if isinstance(spec, (tuple, list)):
        return [_spec(v) for v in spec]
    if not hasattr(spec, "shape"):  # an optional input given as None (a NoneTensorSpec)
        return None
    return {"shape": [None if d is None else int(d) for d in spec.shape.as_list()],
            "dtype": spec.dtype.name}


def record(run_dir: Path, source: Any) -> None:
    """Writes `model_inputs.json` where it is missing or says something else."""
    path = RunDir(run_dir).inputs
    found = describe(source)
    if kept(run_dir) != found:
        write_json(path, found)


def kept(run_dir: Path) -> dict[str, Any] | None:
    """What the run recorded; None for a run from before the file (or a damaged one)."""
    try:
        found = json.loads(RunDir(run_dir).inputs.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and "examples" in found else None


def shown(spec: Mapping[str, Any]) -> str:
    """`(8, 8, 1) uint8`: one example's shape and dtype."""
    return f"{tuple(spec['shape'])} {spec['dtype']}"


def rows(indices: Any, total: int) -> str:
    """`rows 2, 5 (2 of 9)` (indices, or the files of images), at most `SHOWN` listed."""
    listed = [str(i) for i in indices[:SHOWN]]
    more = ", ..." if len(indices) > SHOWN else ""
    word = "row" if len(indices) == 1 else "rows"
    return f"{word} {', '.join(listed)}{more} ({len(indices)} of {total})"


def conform(data: Any, expected: Any, where: str) -> Any:
    """`data` (an array, or a dict of arrays by input name) as the examples `expected`
    describes: each example's shape checked (flat rows, a CSV's, reshaped where the sizes
    match), no NaN or Inf, and the dtype cast where no value changes.

    Raises:
        ConfigError: one line naming `where` (the file, the array), the rows, and the shape
            and dtype the model takes.
    """
    if isinstance(expected, Mapping) and "dtype" not in expected:
        return _named(data, expected, where)
    if isinstance(expected, list):
        named = dict(zip(map(str, range(len(expected))), expected, strict=True))
        found = _named(data, named, where, positional=True)
        return tuple(found[str(i)] for i in range(len(expected)))
    if isinstance(data, Mapping):
        if len(data) != 1:
            raise ConfigError(f"{where} holds {len(data)} arrays ({', '.join(map(str, data))}); "
                              f"the model takes one input, examples of {shown(expected)}: "
                              "pass one array (a .npy, or a .npz holding one)")
        key, data = next(iter(data.items()))
        where = f"{where} array {key!r}"
    return _one(np.asarray(data), expected, where)


def _named(data: Any, expected: Mapping[str, Any], where: str,
           positional: bool = False) -> dict[str, Any]:
    names = ", ".join(f"{k} {shown(v)}" for k, v in expected.items())
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} is one array; the model takes {len(expected)} inputs "
                          f"({names}): pass a .npz (or a dict) with one array each")
    given = dict(data)
    if positional and set(given) != set(expected) and len(given) == len(expected):
        given = dict(zip(expected, given.values(), strict=True))  # np.savez's arr_0, arr_1
    if set(given) != set(expected):
        raise ConfigError(f"{where} holds the arrays {', '.join(map(str, given)) or 'none'}; "
                          f"the model takes {names}: one array per input, by name")
    found = {k: _one(np.asarray(given[k]), spec, f"{where} array {k!r}")
             for k, spec in expected.items()}
    counts = {len(v) for v in found.values()}
    if len(counts) > 1:
        raise ConfigError(f"{where}: its arrays hold different numbers of examples "
                          f"({', '.join(f'{k}: {len(v)}' for k, v in found.items())})")
    return found


def _one(array: np.ndarray, spec: Mapping[str, Any], where: str) -> np.ndarray:
    shape = tuple(spec["shape"])
    if array.ndim == 0 or len(array) == 0:
        raise ConfigError(f"{where} holds no examples (examples go on the first axis); the "
                          f"model takes examples of {shown(spec)}")
    if not _fits(array.shape[1:], shape):
        size = int(np.prod(shape)) if None not in shape else -1
        if size > 0 and (array.ndim == 2 and array.shape[1] == size
                         or _squeezed(array.shape[1:]) == _squeezed(shape)):
            # flat rows (a CSV's) of an image-shaped input, or an axis of 1 more or less
            array = array.reshape((len(array), *shape))
        else:
            flat = (f" (or {size} values per row, flattened)" if size > 0 and len(shape) > 1
                    else "")
            raise ConfigError(f"{where} holds examples of shape {array.shape[1:]} "
                              f"({len(array)} of them); the model takes examples of "
                              f"{shown(spec)}{flat}")
    return _cast(array, spec, where)


def _squeezed(shape: tuple) -> list:
    return [d for d in shape if d != 1]


def _fits(found: tuple, shape: tuple) -> bool:
    return len(found) == len(shape) and all(d is None or d == f for f, d in zip(found, shape,
                                                                                 strict=True))


def _cast(array: np.ndarray, spec: Mapping[str, Any], where: str) -> np.ndarray:
    """The array in the source's dtype, where no value changes; NaN or Inf refused."""
    want = np.dtype(spec["dtype"]) if spec["dtype"] != "string" else None
    if array.dtype.kind not in "biuf" or want is None or want.kind not in "biuf":
        raise ConfigError(f"{where} holds {array.dtype} values; the model takes examples of "
                          f"{shown(spec)}")
    if array.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(array.reshape(len(array), -1)).all(axis=1))
        if len(bad):
            raise ConfigError(f"{where} has NaN or Inf in {rows(bad, len(array))}; the "
                              "model's outputs for them would be NaN: fix or drop those rows")
    if array.dtype == want or want.kind == "f":
        return array.astype(want, copy=False)
    low, high = (np.iinfo(want).min, np.iinfo(want).max) if want.kind in "iu" else (0, 1)
    flat = array.reshape(len(array), -1)
    bad = np.flatnonzero(((flat != np.round(flat)) | (flat < low) | (flat > high)).any(axis=1))
    if len(bad):
        raise ConfigError(f"{where} holds values that are not whole numbers from {low} to "
                          f"{high} in {rows(bad, len(array))}; the model takes examples of "
                          f"{shown(spec)}, the raw values the run's source gave (before its "
                          "preprocessing)")
    return array.astype(want)


def non_finite(outputs: Any) -> np.ndarray:
    """The rows whose outputs (an array, or a list or dict of them) hold NaN or Inf."""
    parts = (list(outputs.values()) if isinstance(outputs, Mapping)
             else list(outputs) if isinstance(outputs, (list, tuple)) else [outputs])
    bad = None
    for part in parts:
        part = np.asarray(part, dtype=np.float64)
        found = ~np.isfinite(part.reshape(len(part), -1)).all(axis=1)
        bad = found if bad is None else bad | found
    return np.flatnonzero(bad) if bad is not None else np.array([], int)
