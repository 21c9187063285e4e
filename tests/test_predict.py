"""Prediction as a careful tool: the run's own class names and input spec, no output
overwritten (never the input), NaN and Inf named by row, every input and output error one
line with nothing left behind, an unfinished run used with a warning, and the Python API's
inputs."""

from __future__ import annotations

import csv
import json
import shutil

import keras
import numpy as np
import pytest
from omegaconf import OmegaConf

import trainer
import trainer.predict as predict_module
from tests.conftest import error_lines, make_config
from tests.test_data import write_images
from trainer.predict import main
from trainer.run.train import train

TINY = ["epochs=1", "verbose=0", "dataset.image_size=8", "logger=[]", "model=small"]


def _digits(count=9):
    from sklearn.datasets import load_digits

    return load_digits().images[:count].astype(np.uint8)[..., None]  # as the source gives


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A digits run, and its examples' raw values in x.npy."""
    root = tmp_path_factory.mktemp("predict")
    run = trainer.fit(TINY, run_dir=root / "run")
    np.save(root / "x.npy", _digits())
    return run.run_dir, root / "x.npy"


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _refused(args, capsys):
    """The command line's one line for `args` (exit 2)."""
    assert main([str(a) for a in args]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0][len("error: "):]


def test_classes_are_named_as_the_run_knew_them_after_the_folder_changed(tmp_path):
    """model_inputs.json keeps the classes and the input spec; renaming cat/ to zz/ makes
    class 0 the folder's second: it is still reported as 'cat'. A run from before the file
    falls back to the source built again, and its data check."""
    images = tmp_path / "images"
    write_images(images, per_class=8)
    run = trainer.fit(["dataset=image_folder", f"dataset.path={images}", "batch.per_replica=4",
                       *TINY], run_dir=tmp_path / "run")
    kept = json.loads((run.run_dir / "model_inputs.json").read_text())
    assert kept == {"examples": {"shape": [], "dtype": "string"}, "model": [8, 8, 3],
                    "class_names": ["cat", "dog"], "num_classes": 2, "num_outputs": 2}
    before = _rows(trainer.predict(run.run_dir, images / "cat", tmp_path / "before.csv")["output"])
    (images / "cat").rename(images / "zz")
    after = _rows(trainer.predict(run.run_dir, images / "zz", tmp_path / "after.csv")["output"])
    assert [(r["class"], r["class_name"], r["p_cat"]) for r in after] == [
        (r["class"], r["class_name"], r["p_cat"]) for r in before]
    assert list(after[0])[-2:] == ["p_cat", "p_dog"] and "cat" in {r["class_name"] for r in after}
    shutil.copytree(images / "dog", images / "emu")  # a class more: the model cannot be built
    with pytest.raises(trainer.TrainerError, match=r"now gives 3 classes \(dog, emu, zz\), the "
                                                   r"run trained on 2 classes \(cat, dog\)"):
        trainer.predict(run.run_dir, images / "zz", tmp_path / "more.csv")
    shutil.rmtree(images / "emu")
    (run.run_dir / "model_inputs.json").unlink()  # as a run from before it
    with pytest.raises(trainer.TrainerError, match="changed since it trained"):
        trainer.predict(run.run_dir, images / "zz", tmp_path / "old.csv")
    (images / "zz").rename(images / "cat")
    old = _rows(trainer.predict(run.run_dir, images / "cat", tmp_path / "old.csv")["output"])
    assert [r["class_name"] for r in old] == [r["class_name"] for r in before]


def test_an_existing_output_is_replaced_only_with_overwrite_and_never_the_input(
        finished_run, tmp_path, capsys):
    run_dir, x = finished_run
    out = tmp_path / "p.csv"
    out.write_text("kept\n")
    assert _refused([run_dir, f"input={x}", f"output={out}"], capsys) == (
        f"output={out} exists; pass overwrite=true to replace it, or name another output=")
    assert out.read_text() == "kept\n"
    assert main([str(run_dir), f"input={x}", f"output={out}", "overwrite=true"]) == 0
    assert len(_rows(out)) == 9
    raw = x.read_bytes()
    for output in (x, tmp_path / "link.npy"):
        if output != x:
            output.symlink_to(x)
        assert _refused([run_dir, f"input={x}", f"output={output}", "overwrite=true"],
                        capsys) == (f"output={output} is the input file; predictions never "
                                    "replace their input: name another output=")
    with pytest.raises(trainer.TrainerError, match="is the input file"):
        trainer.predict(run_dir, x, x, overwrite=True)
    assert x.read_bytes() == raw
    capsys.readouterr()


def test_nan_or_inf_in_the_inputs_or_the_outputs_is_one_line_naming_the_rows(
        finished_run, tmp_path, capsys, monkeypatch):
    run_dir, _ = finished_run
    x = _digits().astype(np.float32)
    x[2, 0, 0, 0], x[5, 3, 3, 0] = np.nan, np.inf
    np.save(tmp_path / "nan.npy", x)
    assert _refused([run_dir, f"input={tmp_path / 'nan.npy'}", f"output={tmp_path / 'p.csv'}"],
                    capsys) == (f"input={tmp_path / 'nan.npy'} has NaN or Inf in rows 2, 5 (2 of "
                                "9); the model's outputs for them would be NaN: fix or drop "
                                "those rows")
    import trainer.run.assembly.restore as restore

    honest = restore.predict_outputs

    def some_nan(*args):
        found = honest(*args)
        found[[1, 7]] = np.nan
        return found

    monkeypatch.setattr(restore, "predict_outputs", some_nan)
    np.save(tmp_path / "x.npy", _digits())
    assert _refused([run_dir, f"input={tmp_path / 'x.npy'}", f"output={tmp_path / 'p.csv'}"],
                    capsys) == ("the model's outputs hold NaN or Inf for rows 1, 7 (2 of 9); "
                                "nothing written: look at those inputs, or predict with the "
                                "other checkpoint (checkpoint=best|last)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nan.npy", "x.npy"]


def _not_yet():
    raise AssertionError("TensorFlow started before the input was checked")


def _write_inputs(folder):
    raw = _digits()
    np.save(folder / "no_channel.npy", raw[..., 0])
    np.save(folder / "wrong_shape.npy", raw[:, :7, :7])
    np.save(folder / "complex.npy", raw.astype(np.complex64))
    np.save(folder / "scaled.npy", raw.astype(np.float32) / 16)
    np.save(folder / "too_big.npy", raw.astype(np.int64) * 100)
    np.savez(folder / "two.npz", a=raw, b=raw)
    np.savetxt(folder / "flat.csv", raw.reshape(9, -1), delimiter=",", fmt="%d",
               header=",".join(f"pixel{i}" for i in range(64)), comments="")
    np.savetxt(folder / "short.csv", raw.reshape(9, -1)[:, :63], delimiter=",", fmt="%d")
    lines = [",".join(map(str, row)) for row in raw.reshape(9, -1)]
    (folder / "ragged.csv").write_text("\n".join([*lines[:3], lines[3] + ",1", *lines[4:]]))
    (folder / "word.csv").write_text("\n".join([*lines[:4], lines[4].replace("0", "x", 1)]))


@pytest.mark.parametrize("name, expected", [
    ("wrong_shape.npy", "input={} holds examples of shape (7, 7, 1) (9 of them); the model "
                        "takes examples of (8, 8, 1) uint8 (or 64 values per row, flattened)"),
    ("complex.npy", "input={} holds complex64 values; the model takes examples of (8, 8, 1) "
                    "uint8"),
    ("scaled.npy", "input={} holds values that are not whole numbers from 0 to 255 in rows "
                   "0, 1, 2, 3, 4, 5, 6, 7, 8 (9 of 9); the model takes examples of (8, 8, 1) "
                   "uint8, the raw values the run's source gave (before its preprocessing)"),
    ("too_big.npy", "input={} holds values that are not whole numbers from 0 to 255 in rows"),
    ("two.npz", "input={} holds 2 arrays (a, b); the model takes one input, examples of (8, 8, "
                "1) uint8: pass one array (a .npy, or a .npz holding one)"),
    ("short.csv", "input={} holds examples of shape (63,) (9 of them); the model takes "
                  "examples of (8, 8, 1) uint8 (or 64 values per row, flattened)"),
    ("ragged.csv", "input={} line 4 has 65 values, line 1 has 64: one example per line, all "
                   "of one size"),
    ("word.csv", "input={} line 5, column "),
])
def test_an_input_error_names_the_file_the_rows_and_what_the_model_takes(
        finished_run, tmp_path, capsys, monkeypatch, name, expected):
    """Each was a traceback (94 lines for a wrong shape), or was predicted on silently (a
    complex array, an (8, 8) array resized, values already scaled); all before TensorFlow."""
    run_dir, _ = finished_run
    _write_inputs(tmp_path)
    monkeypatch.setattr(predict_module.process, "start_tensorflow", _not_yet)
    line = _refused([run_dir, f"input={tmp_path / name}", f"output={tmp_path / 'p.csv'}"],
                    capsys)
    assert line.startswith(expected.format(tmp_path / name)), line
    assert not (tmp_path / "p.csv").exists()


def test_flat_csv_rows_and_a_missing_channel_axis_are_the_examples_reshaped(
        finished_run, tmp_path):
    run_dir, x = finished_run
    _write_inputs(tmp_path)
    expected = [r["class"] for r in _rows(trainer.predict(run_dir, x, tmp_path / "x.csv")[
        "output"])]
    for name in ("flat.csv", "no_channel.npy"):
        found = trainer.predict(run_dir, tmp_path / name, tmp_path / f"{name}.csv")
        assert [r["class"] for r in _rows(found["output"])] == expected, name


def test_an_output_that_cannot_be_written_is_one_line_leaving_nothing(
        finished_run, tmp_path, capsys, monkeypatch):
    run_dir, x = finished_run
    (tmp_path / "file").write_text("x")
    for output, expected in (
            (tmp_path, f"output={tmp_path} is a directory; name a file in it, e.g. "
                       f"output={tmp_path / 'predictions.csv'}"),
            (tmp_path / "file" / "p.csv", f"output={tmp_path / 'file' / 'p.csv'} cannot be "
                                          f"written: {tmp_path / 'file'} is a file, not a "
                                          "directory")):
        assert _refused([run_dir, f"input={x}", f"output={output}"], capsys) == expected
    # A read-only folder (tests run as root, for whom nothing is: decided by os.access).
    real_access = predict_module.os.access
    monkeypatch.setattr(predict_module.os, "access",
                        lambda path, mode: path != tmp_path and real_access(path, mode))
    assert _refused([run_dir, f"input={x}", f"output={tmp_path / 'new' / 'p.csv'}"],
                    capsys) == (f"output={tmp_path / 'new' / 'p.csv'} cannot be written: "
                                f"{tmp_path} is read-only for this user")
    monkeypatch.undo()

    # A write that fails midway (the disk full): no .tmp-* and no folder made for it left.
    def full(path, *args):
        path.write_text("half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(predict_module, "_write_csv", full)
    output = tmp_path / "deep" / "er" / "p.csv"
    assert _refused([run_dir, f"input={x}", f"output={output}"], capsys) == (
        f"output={output} cannot be written (No space left on device); nothing was written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_an_unfinished_run_is_used_with_a_warning_line_naming_the_epoch_and_checkpoint(
        tmp_path, capsys):
    class Killed(keras.callbacks.Callback):
        """Ends the run as a kill would, mid-way through epoch 2 of 3."""

        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations) == self.params["steps"] + 5:
                raise RuntimeError("killed")

    cfg = make_config(*TINY, "epochs=3", "checkpoint.backup_every=2")
    with pytest.raises(RuntimeError, match="killed"):
        train(cfg, tmp_path / "run", callbacks=[Killed()])
    (tmp_path / "run" / ".hydra").mkdir()
    OmegaConf.save(cfg, tmp_path / "run" / ".hydra" / "config.yaml")
    np.save(tmp_path / "x.npy", _digits())
    state = json.loads(sorted((tmp_path / "run" / "backup").glob("ckpt-*/state.json"))[-1]
                       .read_text())
    best = json.loads((tmp_path / "run" / "checkpoints" / "best.keras.best.json").read_text())
    assert main([str(tmp_path / "run"), f"input={tmp_path / 'x.npy'}"]) == 0
    captured = capsys.readouterr()
    assert error_lines(captured.err) == [
        f"warning: {tmp_path / 'run'} did not finish (no summary.json): it stopped in epoch 2 "
        f"of 3, its newest backup at step {state['step']}; predicting with "
        f"{tmp_path / 'run' / 'checkpoints' / 'best.keras'}, the best val_accuracy "
        f"({best['best']:.4g}) of epoch 1"]
    assert state["epoch"] == 1 and json.loads(captured.out)["rows"] == 9


def test_the_python_api_takes_paths_lists_of_images_and_arrays_and_refuses_the_rest(
        finished_run, tmp_path):
    run_dir, x = finished_run
    expected = _rows(trainer.predict(run_dir, x, tmp_path / "file.csv")["output"])
    raw = np.load(x)
    for given, name in ((raw, "array"), ({"x": raw}, "dict")):
        found = _rows(trainer.predict(run_dir, given, tmp_path / f"{name}.csv")["output"])
        assert found == expected, name
    for given, kind in (([1, 2, 3], "list [1, 2, 3]"), ([str(x)], "list"),
                        (raw.tolist()[0][0], "list")):
        with pytest.raises(trainer.TrainerError) as caught:
            trainer.predict(run_dir, given, tmp_path / "bad.csv")
        assert str(caught.value).startswith(
            "input is a .npy, .npz or .csv file, or from Python a NumPy array or a dict of "
            f"them (one per named input); received {kind}"), caught.value
    with pytest.raises(trainer.TrainerError, match="overrides are a list of strings"):
        trainer.predict(run_dir, x, tmp_path / "bad.csv", "devices=1")
    assert not (tmp_path / "bad.csv").exists()


def test_a_list_of_image_paths_is_predicted_in_the_order_given(tmp_path):
    images = tmp_path / "images"
    write_images(images, per_class=8)
    run = trainer.fit(["dataset=image_folder", f"dataset.path={images}", "batch.per_replica=4",
                       *TINY], run_dir=tmp_path / "run")
    files = [images / "dog" / "3.png", images / "cat" / "0.jpg", images / "cat" / "5.png"]
    rows = _rows(trainer.predict(run.run_dir, files, tmp_path / "p.csv")["output"])
    assert [r["input"] for r in rows] == [str(f) for f in files]
    shutil.copy(files[0], tmp_path / "one.png")
    single = _rows(trainer.predict(run.run_dir, tmp_path / "one.png", tmp_path / "q.csv")[
        "output"])
    assert float(single[0]["p_cat"]) == pytest.approx(float(rows[0]["p_cat"]), abs=1e-6)
    damaged = tmp_path / "damaged.png"  # its signature and end marker intact
    data = bytearray(files[0].read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = b"\xff" * 64
    damaged.write_bytes(bytes(data))
    for given, expected in (
            ([files[0], damaged, files[1]], f"input: {damaged} does not decode as an image"),
            ([files[0], images / "nope.png"], f"input: {images / 'nope.png'} is not a file"),
            ([images / "cat"], f"input: {images / 'cat'} is not a file"),
            (np.zeros((2, 8, 8, 3)), "this run was trained on an image folder: input is a "
                                     "folder of images or an image file (from Python also a "
                                     "list of image paths); received ndarray")):
        with pytest.raises(trainer.TrainerError) as caught:
            trainer.predict(run.run_dir, given, tmp_path / "bad.csv")
        assert str(caught.value).startswith(expected), caught.value


def test_evaluate_refuses_overrides_given_as_one_string(finished_run):
    run_dir, _ = finished_run
    with pytest.raises(trainer.TrainerError, match=r"^trainer.evaluate: overrides are a list of "
                                                   r"strings, one key=value each: \['split=test'"
                                                   r"\]; received the one string 'split=test'$"):
        trainer.evaluate(run_dir, "split=test")
