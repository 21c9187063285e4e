"""Trackers (`logger=[...]`): what each one writes, read back with its own tools, and the
one-line refusals of a tracker that cannot start."""

from __future__ import annotations

import csv
import importlib.util
import json
import socket

import pytest
from conftest import TINY, error_lines, run_main

from trainer.config.errors import ConfigError
from trainer.run.train import train
from trainer.track.loggers import check_loggers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unknown_logger_lists_the_available_ones():
    with pytest.raises(ConfigError, match="unknown logger 'mlflw'; available: tensorboard, "
                                          "csv, mlflow, wandb"):
        check_loggers({"mlflw": {}})


def test_an_unknown_logger_on_the_command_line_is_one_line(tmp_path):
    out = run_main("logger=[csv,mlfow]", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
                  timeout=60)
    assert out.returncode == 2
    assert error_lines(out.stderr) == [
        "error: unknown logger 'mlfow'; available: csv, mlflow, tensorboard, wandb"]
    assert not (tmp_path / "run").exists()


def test_a_missing_package_names_the_logger_and_how_to_install_or_drop_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ConfigError) as error:
        check_loggers({"tensorboard": {}, "mlflow": {}})
    assert str(error.value) == ("logger mlflow needs the mlflow package, which is not "
                                "installed: pip install 'trainer[mlflow]' (or drop it: "
                                "logger=[tensorboard])")


def test_wandb_online_without_an_api_key_is_one_line(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # no `wandb login` here
    check_loggers({"wandb": {"mode": "offline"}})
    with pytest.raises(ConfigError, match=r"logger.wandb.mode=online needs an API key "
                                          r"\(WANDB_API_KEY, or `wandb login`\)"):
        check_loggers({"wandb": {"mode": "online"}})
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    check_loggers({"wandb": {"mode": "online"}})


def test_an_unreachable_tracking_server_is_one_line_before_tensorflow_starts(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError, match="cannot reach its tracking server"):
        check_loggers({"mlflow": {"tracking_uri": uri}}, reach=True)
    run_dir = tmp_path / "run"
    out = run_main("logger=[mlflow]", f"logger.mlflow.tracking_uri={uri}",
                  f"hydra.run.dir={run_dir}", cwd=tmp_path, timeout=60)
    assert out.returncode == 2
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and lines[0].startswith(
        f"error: logger mlflow cannot reach its tracking server {uri} ("), out.stderr
    assert "logger.mlflow.tracking_uri=null" in lines[0] and "logger=[]" in lines[0]
    assert not run_dir.exists()  # nothing written


@pytest.mark.long  # MLflow end to end in the default run: the sqlite-artifacts test below
def test_csv_and_mlflow_log_config_epochs_summary_and_checkpoint(tiny_config, tmp_path):
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    summary = train(tiny_config("accelerator=cpu", "devices=2", "epochs=2",
                                "logger=[csv,mlflow]"), run_dir=run_dir)
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["epoch"] for r in rows] == ["0", "1"] and "val_accuracy" in rows[0]

    # MLflow's own client, on the local store next to the run directory.
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert summary["loggers"]["mlflow"].startswith(f"mlflow ui --backend-store-uri {store}")
    client = MlflowClient(store)
    run_id = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    params = run.data.params
    assert params["devices"] == "2" and params["optimizer.lr"] == "0.001"
    assert params["model._target_"] == "small_model.build"  # tiny_config's model=small
    assert params["batch.per_replica"] == "64" and params["epochs"] == "2"
    history = client.get_metric_history(run_id, "val_accuracy")
    assert [m.step for m in history] == [0, 1]
    assert [m.value for m in history] == pytest.approx([float(r["val_accuracy"]) for r in rows])
    assert run.data.metrics["final_accuracy"] == pytest.approx(
        summary["validation_metrics"]["accuracy"])
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert artifacts == {"summary.json", "checkpoints"}
    assert [a.path for a in client.list_artifacts(run_id, "checkpoints")] == [
        "checkpoints/best.keras"]


@pytest.mark.long
def test_a_resumed_run_continues_its_mlflow_run_and_csv(tiny_config, tmp_path):
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    train(tiny_config("epochs=1", "logger=[csv,mlflow]"), run_dir=run_dir)
    train(tiny_config("epochs=2", "logger=[csv,mlflow]", f"resume={run_dir}"))
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("trainer").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "loss")] == [0, 1]
    assert len((run_dir / "metrics.csv").read_text().splitlines()) == 1 + 2


@pytest.mark.long  # the default run stays under 8 minutes on 2 cores
def test_wandb_writes_an_offline_run_into_the_run_directory(tiny_config, tmp_path):
    pytest.importorskip("wandb", reason="the wandb extra: pip install 'trainer[wandb]'")
    run_dir = tmp_path / "run"
    summary = train(tiny_config("epochs=2", "logger=[wandb]"), run_dir=run_dir)
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and summary["loggers"]["wandb"].startswith(str(runs[0]))
    data = next(runs[0].glob("*.wandb")).read_bytes()
    assert b"val_accuracy" in data and b"optimizer" in data  # epochs and the config


@pytest.mark.parametrize("loop", ["fit", pytest.param("custom", marks=pytest.mark.long)])
def test_profile_writes_a_tensorboard_profile_of_the_chosen_steps(tiny_config, tmp_path, loop):
    run_dir = tmp_path / "run"
    train(tiny_config("epochs=1", f"loop={loop}", "profile=[5,8]", "logger=[]",
                      "steps_per_execution=1"), run_dir=run_dir)
    profiles = list((run_dir / "tensorboard").rglob("plugins/profile/*/*.xplane.pb"))
    assert len(profiles) == 1 and profiles[0].stat().st_size > 0


@pytest.mark.parametrize("value", ["[8,5]", "[0,3]", "5", "[1,2,3]"])
def test_a_bad_profile_range_is_one_line(tmp_path, value):
    out = run_main(f"profile={value}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
                  timeout=60)
    assert out.returncode == 2
    assert error_lines(out.stderr) == [
        "error: profile must be [first_step, last_step] with 1 <= first <= last, e.g. "
        f"profile=[5,8], or null; received: {value.replace(',', ', ')}"], out.stderr


def test_csv_logger_and_the_csv_callback_on_one_file_are_refused(make_run):
    from trainer.run.prepare.preflight import check_config as validate

    with pytest.raises(ConfigError, match="logger=\\[csv\\] and callbacks.csv_logger would both "
                                          "append to metrics.csv"):
        validate(make_run("logger=[csv]", "callbacks=[csv_logger]"))
    validate(make_run("logger=[csv]", "logger.csv.filename=epochs.csv", "callbacks=[csv_logger]"))



OWN_TRACKER = '''
import json

import keras


class EpochFile(keras.callbacks.Callback):
    def __init__(self, path):
        super().__init__()
        self.path = path

    def on_epoch_end(self, epoch, logs=None):
        with open(self.path, "a") as f:
            row = {"epoch": epoch, **{k: float(v) for k, v in (logs or {}).items()}}
            f.write(json.dumps(row) + "\\n")


def build(run_dir, params, chief, name="epochs.jsonl"):
    assert params["epochs"] == 2
    return EpochFile(str(run_dir / name)) if chief else None
'''


@pytest.mark.long  # the default run stays under 8 minutes on 2 cores
def test_a_tracker_of_ones_own_is_a_yaml_file_away(tmp_path, monkeypatch):
    """The command line in this process (`python -m trainer` puts its folder on the path:
    here the test does), the small network."""
    (tmp_path / "my_tracker.py").write_text(OWN_TRACKER)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "conf" / "logger").mkdir(parents=True)
    (tmp_path / "conf" / "logger" / "mine.yaml").write_text(
        "mine:\n  _target_: my_tracker.build\n  name: epochs.jsonl\n")
    run_dir = tmp_path / "run"
    tiny = [o for o in TINY if not o.startswith("logger=")]
    out = run_main("--config-dir", str(tmp_path / "conf"), *tiny, "logger=[mine,csv]",
                   "model=small", "epochs=2", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in (run_dir / "epochs.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [0, 1] and "val_loss" in rows[0]
    assert (run_dir / "metrics.csv").is_file()


def test_a_logger_without_a_builder_or_an_unimportable_one_is_one_line():
    with pytest.raises(ConfigError, match="unknown logger 'mine'; available: tensorboard, "
                       "csv, mlflow, wandb, or a node with _target_"):
        check_loggers({"mine": {"name": "x"}})
    with pytest.raises(ConfigError, match="logger mine: cannot import 'no_such_module.build'"):
        check_loggers({"mine": {"_target_": "no_such_module.build"}})


SEEN = {}


def capture_params(run_dir, params, chief):
    """A logger builder of the test's own: keeps what it was handed."""
    SEEN.update(params=params, chief=chief)
    return None


def test_a_tracker_gets_the_config_as_written_not_instantiated(tmp_path):
    from trainer.track.trackers import build_trackers

    config = {"augment": [{"_target_": "collections.OrderedDict"}], "note": "${not_resolved}"}
    trackers = build_trackers({"mine": {"_target_": "test_loggers.capture_params"}}, tmp_path,
                              config, chief=True)
    assert trackers == [] and SEEN["chief"] is True
    assert SEEN["params"] == {"augment": [{"_target_": "collections.OrderedDict"}],
                              "note": "${not_resolved}"}


def test_an_unwritable_sqlite_store_is_one_line_before_anything_is_written(tmp_path,
                                                                          monkeypatch):
    """MLflow retried it for two minutes, then failed mid-run with 37 lines."""
    (tmp_path / "a_file").write_text("not a folder")
    uri = f"sqlite:///{tmp_path / 'a_file' / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    out = run_main(*TINY, "logger=[mlflow]", f"logger.mlflow.tracking_uri={uri}",
                   f"hydra.run.dir={run_dir}", cwd=tmp_path, timeout=60)
    assert out.returncode == 2
    assert error_lines(out.stderr) == [
        f"error: logger mlflow cannot write its store {uri} ({tmp_path / 'a_file'} is a file, "
        "not a directory); choose a writable place (logger.mlflow.tracking_uri=sqlite:////"
        "PATH/mlflow.db), logger.mlflow.tracking_uri=null for a local store next to the run "
        "directory, or drop it: logger=[]"]
    assert not run_dir.exists()
    # read-only (faked: tests run as root, for whom only a read-only file system is)
    check_loggers({"mlflow": {"tracking_uri": f"sqlite:///{tmp_path}/new/mlflow.db"}},
                  reach=True)
    (tmp_path / "mlflow.db").write_bytes(b"")
    monkeypatch.setattr("trainer.track.loggers.os.access", lambda path, mode: False)
    for name in ("mlflow.db", "new/mlflow.db"):
        with pytest.raises(ConfigError, match=r"is read-only for this user\); choose a "
                                              "writable place"):
            check_loggers({"mlflow": {"tracking_uri": f"sqlite:///{tmp_path}/{name}"}},
                          reach=True)
    with pytest.raises(ConfigError, match=r"cannot write its artifacts into "
                                          r"logger.mlflow.artifact_location=/ro/art"):
        check_loggers({"mlflow": {"artifact_location": "/ro/art"}}, reach=True)


def test_a_file_store_mlflow_refuses_is_one_line_with_the_remedy(tmp_path, monkeypatch):
    pytest.importorskip("mlflow.environment_variables")
    from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    if MLFLOW_ALLOW_FILE_STORE.get():
        pytest.skip("this MLflow opens file stores")
    uri = f"file://{tmp_path / 'store'}"
    run_dir = tmp_path / "run"
    out = run_main(*TINY, "logger=[csv,mlflow]", f"logger.mlflow.tracking_uri={uri}",
                   f"hydra.run.dir={run_dir}", cwd=tmp_path, timeout=60)
    assert out.returncode == 2
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and lines[0].startswith(
        f"error: logger mlflow: tracking_uri={uri} is a file store"), out.stderr
    assert lines[0].endswith("set MLFLOW_ALLOW_FILE_STORE=true, or drop it: logger=[csv]")
    assert not run_dir.exists() and not (tmp_path / "store").exists()


LONG = ("The store is in maintenance mode.\nPlease migrate to a database backend " + "x" * 400
        + ".\nIf you must, set `ALLOW=true` to opt out of this exception.")


def failing_tracker(run_dir, params, chief):
    """A logger builder of the test's own that cannot start, with a long message."""
    raise RuntimeError(LONG)


def test_a_tracker_that_cannot_start_says_all_it_said_on_one_line(tmp_path):
    from trainer.track.trackers import build_trackers

    with pytest.raises(ConfigError) as error:
        build_trackers({"mine": {"_target_": "test_loggers.failing_tracker"}}, tmp_path, {},
                       chief=True)
    message = str(error.value)
    assert "\n" not in message
    assert message == (f"logger mine could not start ({' '.join(LONG.splitlines())}); fix its "
                       "logger.mine options, or drop it: logger=[]")


def test_a_tracker_that_cannot_start_fails_before_checkpoints_exist(tiny_config, tmp_path):
    run_dir = tmp_path / "run"
    cfg = tiny_config("+logger.mine._target_=test_loggers.failing_tracker")
    with pytest.raises(ConfigError, match="logger mine could not start"):
        train(cfg, run_dir=run_dir)
    assert not run_dir.exists()  # no checkpoints/: the run directory it created is gone


def test_artifacts_of_a_users_sqlite_store_go_beside_it_and_the_summary_says_so(
        tiny_config, tmp_path, monkeypatch):
    """They went to ./mlruns in whatever the working directory was, unannounced."""
    monkeypatch.chdir(tmp_path)
    store = tmp_path / "store"
    summary = train(tiny_config("logger=[mlflow]", "logger.mlflow.log_checkpoint=false",
                                f"logger.mlflow.tracking_uri=sqlite:///{store}/mlflow.db"),
                    run_dir=tmp_path / "run")
    assert not (tmp_path / "mlruns").exists()
    where = summary["loggers"]["mlflow"]
    run_id = json.loads((tmp_path / "run" / "mlflow_run.json").read_text())["run_id"]
    folder = store / "mlartifacts" / run_id / "artifacts"
    assert where.endswith(f"(run {run_id}; artifacts in {folder})"), where
    assert (folder / "summary.json").is_file()
