"""A model taking strings and `export=[tflite]` or `[onnx]`: refused in one line once the
model is built, before training and before anything is written, where the format cannot
take it here; exported (and checked) where it can (#35)."""

from __future__ import annotations

from tests.conftest import error_lines, run_main

TEXT = ["epochs=1", "verbose=0", "logger=[]", "optimizer=adam", "accelerator=cpu", "devices=1",
        "dataset._target_=parity_task.text"]


def test_a_text_model_to_tflite_or_onnx_is_refused_before_training(tmp_path):
    """A `TextVectorization` lower-cases and splits with TensorFlow's own ops: the run used
    to train, then fail in the export (TFLite's line blamed the precision; ONNX's was a
    traceback), its checkpoints left behind."""
    for export, why in (("tflite", "it needs TensorFlow's own ops FlexStringLower, which "
                                   "TFLite's interpreter does not run"),
                        ("onnx", "ONNX Runtime has no StaticRegexReplace op")):
        run_dir = tmp_path / export
        done = run_main(*TEXT, "model._target_=parity_task.text_model",
                        f"export=[saved_model,{export}]", f"hydra.run.dir={run_dir}",
                        cwd=tmp_path)
        assert done.returncode == 2, done.stderr[-2000:]
        assert error_lines(done.stderr) == [
            f"error: export {export}: the model's input #0 takes strings (dtype "
            f"string), which {export} cannot take here ({why}); use export=saved_model (its "
            "serving signature takes strings), or the checkpoint itself (.keras), or drop "
            "it: export=[saved_model]"]
        assert not run_dir.exists()


def test_a_string_lookup_model_exports_to_tflite(tmp_path):
    """A `StringLookup` alone converts to TFLite's own hash-table ops: exported and checked."""
    run_dir = tmp_path / "run"
    done = run_main(*TEXT, "model._target_=string_task.lookup_model", "export=[tflite]",
                    f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (run_dir / "model.tflite").is_file()
    assert not list(run_dir.glob(".tmp-*"))
