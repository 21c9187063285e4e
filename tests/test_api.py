"""The Python API (`trainer.fit`, `trainer.evaluate`, `trainer.predict`) and prediction on
any number of devices."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import trainer
from tests.conftest import REPO, error_lines, run_main
from tests.test_data import write_images
from tests.test_readme_examples import examples

TINY = ["epochs=1", "verbose=0", "dataset.image_size=8", "logger=[]"]


def _python(script: str, cwd, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "PYTHONPATH")}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the API quiets TensorFlow itself
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


# Run after the README's example, in its process: what `fit` and `evaluate` returned, next
# to what the run wrote.
CHECK = """
import json, pathlib
written = json.loads((pathlib.Path(result.run_dir) / "summary.json").read_text())
tested = trainer.evaluate(result.run_dir, ["split=test"])["metrics"]
print(json.dumps({"same_summary": result.summary == written,
                  "history": {k: len(v) for k, v in result.history.items()},
                  "history_keys": sorted(written["history"]),
                  "checkpoints": sorted(result.checkpoints),
                  "test_accuracy": [result.metrics["test_accuracy"],
                                    written["test_metrics"]["accuracy"]],
                  "evaluated": [tested, written["test_metrics"]]}))
"""


def test_the_readmes_python_example_runs_verbatim_outside_the_repository(tmp_path):
    """The README's block as written, then checks of what `fit` returned (the same process:
    one TensorFlow start-up for both)."""
    out = _python(examples()["api.py"] + CHECK, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert error_lines(out.stderr) == [], out.stderr[-3000:]  # TensorFlow's noise kept out
    [run_dir] = [p.parent for p in tmp_path.glob("outputs/*/*/summary.json")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["replicas"] == 2 and len(summary["history"]["val_accuracy"]) == 1
    assert str(summary["history"]["val_accuracy"]) in out.stdout
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    # fit returns the summary the command line writes, its history, checkpoints and metrics
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["same_summary"] is True
    assert found["history"] == {k: 1 for k in found["history_keys"]}
    assert found["checkpoints"] == ["best", "last"]
    assert found["test_accuracy"][0] == found["test_accuracy"][1]
    tested, written = found["evaluated"]
    assert tested == pytest.approx(written, abs=1e-6)


@pytest.mark.parametrize("override", ["epochs=zero", "optimizer=adamm", "+epoch=1"])
def test_a_bad_override_raises_the_command_lines_line(tmp_path, override):
    line = error_lines(run_main(*TINY, override, f"hydra.run.dir={tmp_path / 'cli'}",
                                cwd=tmp_path).stderr)
    with pytest.raises(trainer.TrainerError) as caught:
        trainer.fit([*TINY, override], run_dir=tmp_path / "api")
    assert line == [f"error: {caught.value}"] and caught.value.exit_code == 2
    assert not (tmp_path / "api").exists()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A default run on the 8x8 digits, one epoch: resumed and predicted from below."""
    return trainer.fit(TINY, run_dir=tmp_path_factory.mktemp("finished") / "run")


def test_a_finished_run_resumed_from_python_returns_its_result(finished_run):
    again = trainer.fit([*TINY, f"resume={finished_run.run_dir}"])
    assert again.summary == finished_run.summary


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict")
    write_images(root / "images", per_class=15)  # validation: 4 images, for 3 replicas
    run = trainer.fit(["dataset=image_folder", f"dataset.path={root / 'images'}",
                       "dataset.image_size=16", "batch.per_replica=4", *TINY[:2], "logger=[]",
                       "model=small"],  # the predictions' order and values are tested
                      run_dir=root / "run")
    new = root / "new"
    write_images(new, classes=("a", "b", "c"), per_class=5)  # 15 images, not a multiple of 4
    return run, new


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_predictions_on_1_and_3_replicas_agree_in_order_and_equal_plain_keras(
        image_run, tmp_path):
    run, new = image_run
    one = trainer.predict(run.run_dir, new, tmp_path / "one.csv", ["accelerator=cpu",
                                                                   "devices=1"])
    three = trainer.predict(run.run_dir, new, tmp_path / "three.csv", ["accelerator=cpu",
                                                                       "devices=3"])
    assert (one["replicas"], three["replicas"], one["rows"]) == (1, 3, 15)
    rows, rows3 = _rows(tmp_path / "one.csv"), _rows(tmp_path / "three.csv")
    assert [(r["index"], r["input"], r["class"]) for r in rows] == [
        (r["index"], r["input"], r["class"]) for r in rows3]
    files = sorted(str(p) for p in new.rglob("*.*"))
    assert [r["input"] for r in rows] == files and [r["index"] for r in rows] == [
        str(i) for i in range(15)]
    assert {r["class_name"] for r in rows} <= {"cat", "dog"}
    # Plain Keras on one device, in a fresh process: what other tests left in this one
    # (Keras's global state) must not decide the reference.
    script = (
        "import json, sys, numpy as np, tensorflow as tf\n"
        "from trainer.run.assembly.restore import load_checkpoint\n"  # keras.models.load_model
        "files = json.loads(sys.argv[2])\n"  # with trainer's custom objects registered
        "model = load_checkpoint(sys.argv[1])\n"
        "images = np.stack([tf.image.resize(tf.io.decode_image(tf.io.read_file(f), channels=3,"
        " expand_animations=False), (16, 16)).numpy() / 255.0 for f in files])\n"
        "print(json.dumps(model.predict(images, verbose=0).tolist()))\n")
    out = subprocess.run([sys.executable, "-c", script, str(run.checkpoints["best"]),
                          json.dumps(files)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",  # small_model:
                              "PYTHONPATH": os.pathsep.join(  # the run's builder module
                                  filter(None, [str(REPO / "tests"),
                                                os.environ.get("PYTHONPATH")]))})
    assert out.returncode == 0, out.stderr[-2000:]
    expected = np.array(json.loads(out.stdout.strip().splitlines()[-1]))
    for name, found in (("1 replica", rows), ("3 replicas", rows3)):
        np.testing.assert_allclose([[float(r[k]) for k in ("p_cat", "p_dog")] for r in found],
                                   expected, atol=1e-6, err_msg=f"{name} vs plain Keras")
    assert [int(r["class"]) for r in rows] == list(expected.argmax(1))


def test_predict_from_the_command_line_and_its_one_line_errors(image_run, tmp_path, capsys):
    from trainer.predict import main

    run, new = image_run
    assert main([str(run.run_dir), f"input={new}", f"output={tmp_path / 'p.npy'}"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 15
    assert np.load(tmp_path / "p.npy").shape == (15, 2)
    for args, expected in (
            ([f"input={tmp_path / 'nothing'}"], "does not exist; pass a folder of images"),
            ([f"input={tmp_path / 'p.npy'}"], "holds no images"),
            ([], "input=PATH is missing"),
            ([f"input={new}", "output=p.txt"], "must end in .csv, .npy, .npz")):
        assert main([str(run.run_dir), *args]) == 2
        lines = error_lines(capsys.readouterr().err)
        assert len(lines) == 1 and expected in lines[0], lines


def test_arrays_in_the_runs_raw_values_are_predicted(finished_run, tmp_path):
    from sklearn.datasets import load_digits

    run = finished_run
    raw = load_digits().images[:9].astype(np.uint8)[..., None]  # as the digits source gives
    np.save(tmp_path / "x.npy", raw)
    result = trainer.predict(run.run_dir, tmp_path / "x.npy")
    rows = _rows(result["output"])
    assert len(rows) == 9 and list(rows[0]) == ["index", "class"] + [f"p_{i}"
                                                                     for i in range(10)]
    assert np.mean([int(r["class"]) == t for r, t in zip(rows, load_digits().target[:9],
                                                         strict=True)]) > 0.5
    with pytest.raises(trainer.TrainerError, match="is not a .npy, .npz or .csv file"):
        trainer.predict(run.run_dir, tmp_path)


def test_fit_reads_the_users_config_dir(tmp_path):
    conf = tmp_path / "conf" / "experiment"
    conf.mkdir(parents=True)
    (conf / "short.yaml").write_text("# @package _global_\nepochs: 2\ndataset:\n"
                                     "  image_size: 8\nverbose: 0\n")
    result = trainer.fit(["experiment=short", "logger=[]", "model=small"],
                         config_dir=tmp_path / "conf", run_dir=tmp_path / "run")
    assert result.summary["epochs"] == 2 and len(result.history["loss"]) == 2


def test_fits_summary_names_the_config_choices(tmp_path):
    """The model's config file's name (`mine`), not its builder's module (`small_model`)."""
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "mine.yaml").write_text("_target_: small_model.build\n")
    result = trainer.fit([*TINY, "model=mine"], config_dir=tmp_path / "conf",
                         run_dir=tmp_path / "run")
    assert (result.summary["model"], result.summary["dataset"]) == ("mine", "digits")


@pytest.mark.parametrize("overrides, expected", [
    (None, "trainer.fit: overrides are a list of strings, one key=value each (e.g. "
           "['epochs=3', 'devices=2']; () for none); received None"),
    (["--help"], "trainer.fit trains one config; --help is a command of the command line's: "
                 "python -m trainer --help"),
    (["--cfg", "job"], "--cfg job is a command of the command line's: python -m trainer "
                       "--cfg job"),
    ("epochs=1 devices=2", "trainer.fit: overrides are a list of strings, one key=value each: "
                           "['epochs=1', 'devices=2']; received the one string "
                           "'epochs=1 devices=2'"),
    (["epochs=1", 2], "item 2 is int 2"),
])
def test_fit_takes_a_list_of_override_strings_and_refuses_anything_else_in_one_line(
        tmp_path, capsys, overrides, expected):
    with pytest.raises(trainer.TrainerError) as caught:
        trainer.fit(overrides, run_dir=tmp_path / "run")
    assert expected in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.exit_code == 2 and caught.value.__cause__ is None
    assert not (tmp_path / "run").exists() and capsys.readouterr().out == ""


def _one_line_each(tmp_path, args, config_dir):
    """The command line's stderr and `fit`'s error for the same arguments, and what each
    left behind."""
    cli = run_main("--config-dir", str(config_dir), *args, f"hydra.run.dir={tmp_path / 'cli'}",
                   cwd=tmp_path)
    with pytest.raises(trainer.TrainerError) as caught:
        trainer.fit(args, config_dir=config_dir, run_dir=tmp_path / "api")
    assert cli.returncode == 2 and caught.value.exit_code == 2
    assert error_lines(cli.stderr) == [f"error: {caught.value}"]
    assert not (tmp_path / "cli").exists() and not (tmp_path / "api").exists()
    return str(caught.value)


def test_a_missing_config_dir_is_refused_before_anything_is_written(tmp_path):
    """Hydra refused it only after the pre-flight had made the run directory (its .lock
    stayed behind); fit trained without it."""
    line = _one_line_each(tmp_path, TINY, tmp_path / "nope")
    assert line == (f"the config directory {tmp_path / 'nope'} (--config-dir) does not exist; "
                    "pass the folder that holds your own YAML files")
    (tmp_path / "file").write_text("epochs: 1\n")
    assert "(--config-dir) is a file, not a folder" in _one_line_each(tmp_path, TINY,
                                                                        tmp_path / "file")


def test_a_yaml_syntax_error_in_a_config_dir_file_is_one_line_naming_the_file(tmp_path):
    bad = tmp_path / "conf" / "experiment" / "bad.yaml"
    bad.parent.mkdir(parents=True)
    bad.write_text("# @package _global_\nepochs: [1\n")
    line = _one_line_each(tmp_path, [*TINY, "experiment=bad"], tmp_path / "conf")
    assert line == (f"{bad} (line 3, column 1) is not valid YAML: expected ',' or ']', but got "
                    "'<stream end>'; fix the file's syntax")


def test_an_unquoted_non_ascii_path_is_one_line_with_the_quoting_hint(tmp_path):
    """Hydra's grammar takes `é` only inside quotes ("LexerNoViableAltException" was the
    line); the hint's quoted override composes to the path."""
    from trainer.config.compose import compose_from_args

    place = tmp_path / "éé"
    line = _one_line_each(tmp_path, [*TINY, f"dataset.path={place}"], tmp_path)
    cli = run_main(*TINY, f"hydra.run.dir={place}", cwd=tmp_path)
    with pytest.raises(trainer.TrainerError) as caught:
        trainer.fit([*TINY, f"hydra.run.dir={place}"])
    quoted = f"hydra.run.dir='{place}'"
    assert str(caught.value) == (f"cannot parse the override 'hydra.run.dir={place}': é may "
                                 f"appear in a value only inside quotes; quote the value: "
                                 f"{quoted} (on a shell, quote it again: \"{quoted}\")")
    assert cli.returncode == 2 and error_lines(cli.stderr) == [f"error: {caught.value}"]
    assert "dataset.path" in line and not place.exists()
    assert compose_from_args([quoted]).hydra.run.dir == str(place)
    assert compose_from_args([f'hydra.run.dir="{place}"']).hydra.run.dir == str(place)
