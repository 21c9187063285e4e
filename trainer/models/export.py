"""Exporting a trained model for serving (`export=[saved_model,tflite,onnx]`), each file
checked before it is kept.

Each format is written under a temporary name (`trainer.rundir.atomic.written`),
loaded back by its own runtime and run on a batch of the run's validation inputs: only when
its outputs match the Keras model's within the format's tolerance (`TOLERANCES`) is it
renamed to its place, so no half-written or wrong file is ever left under the final name.
A mismatch is one line naming the format and the largest difference.

- `saved_model`: Keras's `model.export` (`format="tf_saved_model"`), loaded with
  `tf.saved_model.load` and run through its `serve` endpoint (the serving signature).
- `tflite`: Keras's LiteRT export (`format="litert"`: the SavedModel through
  `tf.lite.TFLiteConverter`, with `SELECT_TF_OPS` for what TFLite lacks, such as string
  inputs), run with `tf.lite.Interpreter` (`ai_edge_litert`'s where TensorFlow has none).
- `onnx`: Keras's ONNX export (`format="onnx"`, tf2onnx under TensorFlow), run with
  onnxruntime; both come with `pip install 'trainer[onnx]'`.

A model that takes strings (a `StringLookup` or `TextVectorization` inside it) is tried
in TFLite and ONNX once it is built, before training (`check_exportable`): ONNX Runtime has
no string-table or regex ops, and TFLite's interpreter here runs no TensorFlow ops (Flex),
which lower-casing and splitting need (a `StringLookup` alone converts). A format that
fails is refused in one line then, not after training.

A build module (TensorFlow at the top); `trainer.models.formats.check_converters` runs in
the pre-flight, before TensorFlow starts.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.config.errors import ConfigError
from trainer.rundir.atomic import written as atomically
from trainer.rundir.layout import RunDir

log = logging.getLogger(__name__)

# The largest difference from the Keras model's outputs each format may show: absolute for
# outputs up to 1 in size (probabilities, logits near zero), relative beyond.
TOLERANCES = {"saved_model": 1e-5, "tflite": 1e-3, "onnx": 1e-4}
# Validation examples each file is checked on (the first batch, at most this many).
CHECKED_EXAMPLES = 16


def export_model(model: Any, run_dir: str | Path, formats: Sequence[str],
                 validation: Any) -> dict[str, str]:
    """Writes the model in each format into the run directory, each checked before it is kept.

    Args:
        model: the trained Keras model.
        run_dir: the run directory (`trainer.rundir.layout.RunDir`).
        formats: the formats, in order (`saved_model`, `tflite`, `onnx`).
        validation: the validation batches, `(inputs, targets, ...)`: the files are checked
            on the first batch's inputs (at most `CHECKED_EXAMPLES` of them).

    Returns:
        `{format: path}` of the files written.

    Raises:
        ConfigError: a file's outputs differ from the Keras model's beyond its tolerance.
    """
    layout = RunDir(run_dir)
    inputs = first_inputs(validation)
    expected = _flat(model(inputs, training=False))
    written = {}
    for name in formats:
        final = layout.export(name)
        with atomically(final) as tmp:  # kept only once checked: a mismatch leaves nothing
            WRITERS[name](model, tmp)
            difference = max_difference(expected, _flat(RUNNERS[name](tmp, inputs)))
            check_difference(name, difference, examples=len(expected[0]), formats=formats)
        log.info("exported %s to %s (largest difference from Keras: %.2e)", name, final,
                 difference)
        written[name] = str(final)
    return written


def check_exportable(model: Any, formats: Sequence[str], validation: Any) -> None:
    """Refuses, before training, a format other than `saved_model` that a model taking
    strings does not export to here: each is written from the untrained model into a
    temporary folder and checked as `export_model` checks it (nothing of the run's written).

    Raises:
        ConfigError: one line naming the format, the string input and what would work.
    """
    strings = string_inputs(model, validation)
    if not strings:
        return
    for name in [f for f in formats if f != "saved_model"]:
        with tempfile.TemporaryDirectory(prefix="trainer-export-check-") as folder:
            try:
                export_model(model, folder, [name], validation)
            except Exception as error:  # noqa: BLE001 - a converter fails in many ways
                rest = ",".join(f for f in formats if f != name)
                raise ConfigError(
                    f"export {name}: the model's input {strings[0]} takes strings (dtype "
                    f"string), which {name} cannot take here ({_why_not(error)}); use "
                    f"export=saved_model (its serving signature takes strings), or the "
                    f"checkpoint itself (.keras), or drop it: export=[{rest}]") from None


def string_inputs(model: Any, validation: Any) -> list[str]:
    """The model's inputs that take strings (from the data's inputs: a subclassed model
    declares none), by name (`'text'`), or by place (`#0`) where a `keras.Input` has none."""
    spec = validation.element_spec
    spec = spec[0] if isinstance(spec, (tuple, list)) else spec
    if isinstance(spec, dict):
        named = [(repr(key), tensor) for key, tensor in spec.items()]
    else:
        flat = keras.tree.flatten(spec)
        declared = [t.name for t in getattr(model, "inputs", None) or []]
        if len(declared) != len(flat):
            declared = [""] * len(flat)
        # an unnamed keras.Input is `keras_tensor_N`: named by its place instead
        named = [(repr(name) if name and not name.startswith("keras_tensor") else f"#{i}",
                  tensor)
                 for i, (name, tensor) in enumerate(zip(declared, flat, strict=True))]
    return [name for name, tensor in named if getattr(tensor, "dtype", None) == tf.string]


def _why_not(error: BaseException) -> str:
    """The short reason a converter or its runtime gave."""
    text = str(error)
    flex = sorted(set(re.findall(r"Flex\w+", text)))
    if flex:
        return (f"it needs TensorFlow's own ops {', '.join(flex)}, which TFLite's interpreter "
                "does not run")
    missing = re.search(r"No Op registered for (\w+)", text)
    if missing:
        return f"ONNX Runtime has no {missing.group(1)} op"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return first[:200]


def first_inputs(validation: Any) -> Any:
    """The inputs of the first validation batch, at most `CHECKED_EXAMPLES`, as NumPy."""
    batch = next(iter(validation))
    inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
    return keras.tree.map_structure(lambda x: np.asarray(x)[:CHECKED_EXAMPLES], inputs)


def max_difference(expected: list[np.ndarray], got: list[np.ndarray]) -> float:
    """The largest difference between two lists of outputs, scaled by the expected value's
    size beyond 1 (infinite where their number or shapes differ)."""
    if len(expected) != len(got):
        return float("inf")
    worst = 0.0
    for want, have in zip(expected, got, strict=True):
        want, have = np.asarray(want, np.float64), np.asarray(have, np.float64)
        if want.shape != have.shape:
            return float("inf")
        if want.size:
            worst = max(worst, float(np.max(np.abs(have - want) / np.maximum(1, np.abs(want)))))
    return worst


def check_difference(name: str, difference: float, examples: int,
                     formats: Sequence[str] = ()) -> None:
    """Refuses a file whose outputs differ from the Keras model's beyond its tolerance."""
    tolerance = TOLERANCES[name]
    if not difference <= tolerance:  # NaN too
        rest = ",".join(f for f in formats if f != name)
        raise ConfigError(f"export {name}: its outputs differ from the Keras model's by up to "
                          f"{difference:.2e} (tolerance {tolerance:.0e}) on {examples} "
                          f"validation examples; the file is not kept (export=[{rest}] leaves "
                          "it out)")


def _flat(outputs: Any) -> list[np.ndarray]:
    return [np.asarray(x) for x in keras.tree.flatten(outputs)]


@contextlib.contextmanager
def _quiet():
    """Converters print and warn what nobody can act on (tf2onnx's NumPy patch, TFLite's
    deprecation notice); a failure still raises."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _write_saved_model(model: Any, path: Path) -> None:
    model.export(str(path), format="tf_saved_model", verbose=False)


def _write_tflite(model: Any, path: Path) -> None:
    with _quiet():
        model.export(str(path), format="litert", verbose=False)


def _write_onnx(model: Any, path: Path) -> None:
    with _quiet():
        model.export(str(path), format="onnx", verbose=False)


def _run_saved_model(path: Path, inputs: Any) -> Any:
    loaded = tf.saved_model.load(str(path))  # held: `serve` alone does not keep its variables
    return loaded.serve(inputs)


def _in_order(names: Sequence[str], inputs: Any) -> dict[str, Any]:
    """Inputs by a runtime's input names: by name where they are the model's, else in order."""
    if isinstance(inputs, dict) and set(names) == set(inputs):
        return dict(inputs)
    flat = keras.tree.flatten(inputs)
    if len(flat) != len(names):
        raise ValueError(f"the exported model takes {len(names)} inputs; the data has "
                         f"{len(flat)}")
    return dict(zip(names, flat, strict=True))


def _natural(name: str) -> list:
    """`output_10` after `output_9`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _run_tflite(path: Path, inputs: Any) -> list[np.ndarray]:
    with _quiet():
        interpreter = _interpreter()(model_path=str(path))
        runner = interpreter.get_signature_runner()
        try:
            outputs = runner(**_in_order(list(runner.get_input_details()), inputs))
        except RuntimeError as error:
            if "Select TensorFlow op" not in str(error):
                raise
            raise _flex_error(error) from None
    return [outputs[key] for key in sorted(outputs, key=_natural)]


def _flex_error(error: RuntimeError) -> ConfigError:
    """TFLite's many-line refusal of a file holding TensorFlow's own (Flex) ops, as one line:
    a float16 or bfloat16 model's layers (`precision=auto` chose mixed_float16 on this GPU)."""
    ops = sorted(set(re.findall(r"Flex\w+", str(error))))
    return ConfigError(f"export tflite: the converted file needs TensorFlow's own ops "
                       f"({', '.join(ops) or 'Flex'}), which TFLite's interpreter does not run, "
                       "so it cannot be checked and is not kept: a mixed_float16 or "
                       "mixed_bfloat16 model's layers need them (precision=float32 avoids it), "
                       "or leave tflite out of export")


def _interpreter() -> Callable:
    lite = getattr(tf, "lite", None)
    if lite is not None and hasattr(lite, "Interpreter"):
        return lite.Interpreter  # with TensorFlow's own ops (SELECT_TF_OPS)
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter


def _run_onnx(path: Path, inputs: Any) -> list[np.ndarray]:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [node.name for node in session.get_inputs()]
    return session.run(None, _in_order(names, inputs))


WRITERS: dict[str, Callable[[Any, Path], None]] = {
    "saved_model": _write_saved_model, "tflite": _write_tflite, "onnx": _write_onnx}
RUNNERS: dict[str, Callable[[Path, Any], Any]] = {
    "saved_model": _run_saved_model, "tflite": _run_tflite, "onnx": _run_onnx}
