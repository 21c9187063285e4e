"""Export formats (`export=[saved_model,tflite,onnx]`): each file reproduces the Keras model's
outputs within its tolerance, a missing converter is refused before training, a mismatch
is one line and leaves no file."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import trainer.models.export as export
import trainer.models.formats as formats
from tests.conftest import error_lines, run_main
from trainer.config.errors import ConfigError
from trainer.config.validate import export_formats
from trainer.run.assembly.restore import load_checkpoint
from trainer.run.train import train
from trainer.rundir.backup import tidy
from trainer.rundir.layout import RunDir
from trainer.rundir.resume import check_resume


def _fresh_inputs() -> np.ndarray:
    """Inputs the exports were not checked on, shaped and scaled as the run's images."""
    return np.random.default_rng(1).random((12, 8, 8, 1)).astype("float32")


def _differences(model, exports: dict[str, str], inputs) -> dict[str, float]:
    expected = export._flat(model(inputs, training=False))
    return {name: export.max_difference(expected, export._flat(export.RUNNERS[name](
        Path(path), inputs))) for name, path in exports.items()}


def test_export_formats_parse_true_false_and_lists():
    assert export_formats(True) == ("saved_model",)
    assert export_formats(False) == export_formats([]) == export_formats(None) == ()
    assert export_formats(["tflite", "saved_model", "tflite"]) == ("tflite", "saved_model")
    assert export_formats("onnx") == ("onnx",)
    with pytest.raises(ConfigError, match=r"^export: unknown format 'tflight'; valid: true, "
                                          r"false or a list of saved_model, tflite, onnx$"):
        export_formats(["saved_model", "tflight"])


def test_an_unknown_export_format_is_one_line_before_anything_runs(tmp_path):
    out = run_main("export=[saved_model,tflight]", f"hydra.run.dir={tmp_path / 'run'}",
                   cwd=tmp_path)
    lines = error_lines(out.stderr)
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "unknown format 'tflight'" in lines[0] and "saved_model, tflite, onnx" in lines[0]
    assert not (tmp_path / "run").exists()


def test_onnx_without_its_converter_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "installed", lambda package: package != "tf2onnx")
    out = run_main("export=[saved_model,onnx]", f"hydra.run.dir={tmp_path / 'run'}",
                   cwd=tmp_path)
    lines = error_lines(out.stderr)
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0] == ("error: export onnx needs tf2onnx, not installed: pip install "
                        "'trainer[onnx]' (or drop it: export=[saved_model])")
    assert not (tmp_path / "run").exists()


def test_train_refuses_a_missing_converter_before_training(tmp_path, tiny_config, monkeypatch):
    monkeypatch.setattr(formats, "installed", lambda package: False)
    with pytest.raises(ConfigError, match=r"pip install 'trainer\[onnx\]'"):
        train(tiny_config("export=[onnx]", "epochs=2"), run_dir=tmp_path)
    assert not any(tmp_path.iterdir())  # nothing trained, nothing written


def test_saved_model_and_tflite_reproduce_the_keras_outputs(tmp_path, tiny_config):
    summary = train(tiny_config("export=[saved_model,tflite]", "accelerator=cpu"),
                    run_dir=tmp_path)
    layout = RunDir(tmp_path)
    assert summary["exports"] == {"saved_model": str(layout.export("saved_model")),
                                  "tflite": str(layout.export("tflite"))}
    assert summary["saved_model"] == str(layout.saved_model)  # the key before formats
    assert json.loads(layout.summary.read_text())["exports"] == summary["exports"]
    assert (layout.saved_model / "saved_model.pb").is_file()
    assert (tmp_path / "model.tflite").is_file()
    assert not list(tmp_path.glob(".tmp-*"))
    # Each file loaded on its own, against the final weights, on inputs it was not checked on.
    model = load_checkpoint(layout.checkpoint("last"))
    found = _differences(model, summary["exports"], _fresh_inputs())
    assert found["saved_model"] <= 1e-5 and found["tflite"] <= 1e-3, found


def test_onnx_reproduces_the_keras_outputs(tmp_path, tiny_config):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: pip install "
                        "'trainer[onnx]'")
    pytest.importorskip("tf2onnx", reason="tf2onnx is not installed: pip install "
                        "'trainer[onnx]'")
    summary = train(tiny_config("export=[onnx]", "accelerator=cpu"), run_dir=tmp_path)
    assert summary["exports"] == {"onnx": str(tmp_path / "model.onnx")}
    assert "saved_model" not in summary and not (tmp_path / "saved_model").exists()
    model = load_checkpoint(RunDir(tmp_path).checkpoint("last"))
    found = _differences(model, summary["exports"], _fresh_inputs())
    assert found["onnx"] <= 1e-4, found


def _small_model():
    inputs = keras.Input((4,), name="features")
    outputs = keras.layers.Dense(3, activation="softmax")(keras.layers.Dense(5)(inputs))
    return keras.Model(inputs, outputs)


def _batches():
    x = np.random.default_rng(0).random((20, 4)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, np.zeros(20, "int32"))).batch(8)


def test_a_mismatch_is_one_line_naming_the_format_and_keeps_no_file(tmp_path, monkeypatch):
    model = _small_model()
    honest = export.RUNNERS["saved_model"]
    monkeypatch.setitem(export.RUNNERS, "saved_model",
                        lambda path, inputs: honest(path, inputs) + 0.01)
    with pytest.raises(ConfigError) as error:
        export.export_model(model, tmp_path, ("saved_model",), _batches())
    assert str(error.value) == (
        "export saved_model: its outputs differ from the Keras model's by up to 1.00e-02 "
        "(tolerance 1e-05) on 8 validation examples; the file is not kept (export=[] leaves "
        "it out)")
    assert not list(tmp_path.iterdir())  # neither saved_model/ nor its temporary name


def test_a_new_export_replaces_the_old_one_whole(tmp_path):
    (tmp_path / "saved_model").mkdir()
    (tmp_path / "saved_model" / "stale.txt").write_text("from an earlier export")
    written = export.export_model(_small_model(), tmp_path, ("saved_model",), _batches())
    assert written == {"saved_model": str(tmp_path / "saved_model")}
    assert not (tmp_path / "saved_model" / "stale.txt").exists()


def test_tidy_removes_an_export_a_kill_left_half_written(tmp_path):
    layout = RunDir(tmp_path)
    layout.export_tmp("tflite").write_bytes(b"half")
    layout.export_tmp("saved_model").mkdir()
    layout.export("onnx").write_bytes(b"a complete export")
    tidy(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_export_may_change_on_resume():
    config = {"model": {"_target_": "m.build"}, "epochs": 2, "export": False}
    state = {"epoch": 1, "step": 0, "config": config}
    assert check_resume(Path("r"), state, {**config, "export": ["saved_model", "onnx"]}) == {
        "export": [False, ["saved_model", "onnx"]]}


def test_a_run_whose_export_failed_is_finished_by_a_resume_without_that_format(
        tmp_path, tiny_config, monkeypatch):
    monkeypatch.setitem(export.TOLERANCES, "tflite", -1.0)  # no file can pass
    with pytest.raises(ConfigError, match=r"^export tflite: .* by up to "):
        train(tiny_config("export=[saved_model,tflite]", "accelerator=cpu"), run_dir=tmp_path)
    layout = RunDir(tmp_path)
    # trained and backed up, but not finished: no summary, no unchecked file in place
    assert not layout.summary.exists() and not layout.export("tflite").exists()
    assert not list(tmp_path.glob(".tmp-*"))
    summary = train(tiny_config("export=[saved_model]", "accelerator=cpu",
                                f"resume={tmp_path}"))
    assert summary["exports"] == {"saved_model": str(layout.saved_model)}
    assert summary["resumed_from"]["changed"] == {
        "export": [["saved_model", "tflite"], ["saved_model"]]}


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_tflite_of_a_mixed_precision_model_is_refused_before_training(tmp_path, precision):
    """Such a file needs TensorFlow's Flex ops, which TFLite's interpreter does not run: the
    export's check failed after the whole training, in a 50-line traceback."""
    out = run_main(f"precision={precision}", "export=[saved_model,tflite]",
                   f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 2 and error_lines(out.stderr) == [
        f"error: export=[tflite] cannot hold a precision={precision} model: TFLite has no "
        f"{precision[6:]} kernels for its layers (the file would need TensorFlow's Flex ops, "
        "which TFLite's interpreter does not run); use precision=float32, or leave tflite "
        "out: export=[saved_model]"]
    assert not (tmp_path / "run").exists()


def test_a_tflite_file_needing_flex_ops_is_one_line_and_not_kept(tmp_path):
    """What `precision=auto` would meet on a GPU that chose mixed_float16 (the pre-flight
    cannot know the GPU): the interpreter's refusal as one line, no file left."""
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        inputs = keras.Input((8, 8, 1))
        x = keras.layers.Conv2D(4, 3)(inputs)
        outputs = keras.layers.Dense(3, dtype="float32")(keras.layers.Flatten()(x))
        model = keras.Model(inputs, outputs)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    images = np.random.default_rng(0).random((8, 8, 8, 1)).astype("float32")
    batches = tf.data.Dataset.from_tensor_slices((images, np.zeros(8, "int32"))).batch(4)
    with pytest.raises(ConfigError) as caught:
        export.export_model(model, tmp_path, ("tflite",), batches)
    assert str(caught.value).startswith("export tflite: the converted file needs TensorFlow's "
                                        "own ops (FlexConv2D")
    assert not list(tmp_path.iterdir())
