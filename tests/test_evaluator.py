"""An evaluator beside the workers (issue #45 item 3): the decisions as pure functions, the
launcher's handling of the evaluator's process, and one run of 2 workers and an evaluator."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
from conftest import make_config

from tests import test_multiworker as multiworker
from trainer.config.errors import ConfigError
from trainer.distribute.cluster import evaluator_task, from_tf_config, resolve_cluster
from trainer.distribute.launch import Launcher, tf_configs, worker_commands
from trainer.run.prepare.resolve import check_with_evaluator, resolve, without_validation
from trainer.run.prepare.sidecar import (
    EvaluatorDir,
    await_result,
    best_record,
    done_line,
    final_summary,
    improved,
    merged,
    ready_epochs,
    validated_line,
)

launches = multiworker.launches  # the launcher's fixture: no process is left behind
CLUSTER = {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"], "evaluator": ["10.0.0.3:2222"]}


def _tf_config(kind: str, index: int = 0) -> str:
    return json.dumps({"cluster": CLUSTER, "task": {"type": kind, "index": index}})


def test_the_workers_learn_of_the_evaluator_which_stays_out_of_their_cluster():
    cluster = from_tf_config(_tf_config("worker", 1))
    assert cluster.evaluator == "10.0.0.3:2222"
    assert cluster.num_workers == 2 and "evaluator" not in cluster.tf_config()["cluster"]
    assert evaluator_task(_tf_config("evaluator")) and not evaluator_task(_tf_config("worker"))
    assert not evaluator_task(None) and not evaluator_task("{not json")


def test_cluster_evaluator_on_the_command_line_and_its_refusals():
    found = resolve_cluster(["10.0.0.1:2222", "10.0.0.2:2222"], 0, None,
                            evaluator="10.0.0.3:2222")
    assert found.evaluator == "10.0.0.3:2222"
    with pytest.raises(ConfigError, match="cluster.evaluator validates beside the workers"):
        resolve_cluster([], 0, None, environ={}, evaluator="10.0.0.3:2222")
    with pytest.raises(ConfigError, match="cluster.evaluator must hold host:port"):
        resolve_cluster(["10.0.0.1:2222"], 0, None, evaluator="nowhere")
    two = json.dumps({"cluster": {**CLUSTER, "evaluator": ["a:1", "b:2"]},
                      "task": {"type": "worker", "index": 0}})
    with pytest.raises(ConfigError, match="one evaluator"):
        from_tf_config(two)


def test_the_next_epochs_are_the_whole_entries_not_yet_validated(tmp_path):
    place = EvaluatorDir.of(tmp_path)
    assert ready_epochs(place.inbox) == []
    place.inbox.mkdir(parents=True)
    for epoch in (1, 2, 3, 10):
        place.weights(epoch).write_bytes(b"w")
    for epoch in (3, 1, 10):  # epoch 2's logs not written yet: its entry is not whole
        place.logs(epoch).write_text("{}")
    assert ready_epochs(place.inbox) == [1, 3, 10]
    assert ready_epochs(place.inbox, done={1}) == [3, 10]


def test_the_best_epoch_by_the_monitor_ties_keep_the_earlier():
    assert improved(0.5, None, "min") and improved(0.4, 0.5, "min")
    assert not improved(0.5, 0.5, "min") and not improved(0.6, 0.5, "min")
    assert improved(0.9, 0.8, "max") and not improved(float("nan"), None, "max")
    records = [{"epoch": 1, "val_loss": 0.7}, {"epoch": 2, "val_loss": 0.5},
               {"epoch": 3, "val_loss": 0.5}, {"epoch": 4, "val_loss": 0.6}]
    assert best_record(records, "val_loss", "min")["epoch"] == 2
    assert best_record(records, "val_loss", "max")["epoch"] == 1
    assert best_record([], "val_loss", "min") is None


def test_the_summary_says_the_evaluator_validated_or_why_not():
    records = [{"epoch": 1, "loss": 1.0, "val_loss": 0.7, "val_accuracy": 0.6},
               {"epoch": 2, "loss": 0.8, "val_loss": 0.5, "val_accuracy": 0.8}]
    best = best_record(records, "val_accuracy", "max")
    result = final_summary(records, {"epochs_done": 2}, best, {"loss": 0.4}, "best.keras")
    chief = {"history": {"loss": [1.0, 0.8]}, "validation_metrics": {}, "test_metrics": None}
    summary = merged(chief, result)
    assert summary["validation_metrics"] == {"loss": 0.5, "accuracy": 0.8}
    assert summary["history"] == {"loss": [1.0, 0.8], "val_loss": [0.7, 0.5],
                                  "val_accuracy": [0.6, 0.8]}
    assert summary["test_metrics"] == {"loss": 0.4}
    assert validated_line(summary["validated_by"]) == (
        "the evaluator (2 epochs; best.keras is epoch 2)")
    short = final_summary(records[:1], {"epochs_done": 2}, records[0], None, None)
    assert validated_line(merged(chief, short)["validated_by"]) == (
        "the evaluator, incomplete: epochs 2 were not validated")
    none = merged(chief, None, "the evaluator gave no result within 1 s")
    assert validated_line(none["validated_by"]) == (
        "the evaluator, incomplete: the evaluator gave no result within 1 s")
    assert validated_line(None) is None  # the chief validated: no row


def test_the_evaluator_says_validated_every_epoch_only_where_it_did():
    assert done_line({"epochs_done": 3}, {1, 2, 3}) == (
        "done: validated every epoch and ran the final test")
    assert done_line({"epochs_done": 3}, {1, 3}) == (
        "done: ran the final test; epoch 2 never came to be validated (the summary says so)")


def test_the_chief_waits_for_the_result_no_longer_than_its_limit(tmp_path):
    place = EvaluatorDir.of(tmp_path)
    result, why = await_result(place, 3, timeout_s=0.2, poll_s=0.05)
    assert result is None and "within 0.2 s" in why
    assert json.loads(place.trained.read_text()) == {"epochs_done": 3}
    place.alive.touch()
    os.utime(place.alive, (1, 1))  # its last sign of life long ago: it died
    result, why = await_result(place, 3, timeout_s=60, poll_s=0.05)
    assert result is None and why.startswith("the evaluator stopped (no sign of life for")
    place.alive.touch()
    place.summary.write_text(json.dumps({"epochs_trained": 3, "epochs": [1, 2, 3]}))
    result, why = await_result(place, 3, timeout_s=5, poll_s=0.05)
    assert result["epochs"] == [1, 2, 3] and why is None


def test_what_needs_validation_on_the_workers_is_refused_in_one_line():
    spec = resolve(make_config("callbacks=early_stopping"))
    with pytest.raises(ConfigError, match=r"^callbacks.early_stopping monitors val_"):
        check_with_evaluator(spec)
    spec = resolve(make_config("checkpoint.keep_best=2"))
    with pytest.raises(ConfigError, match="checkpoint.keep_best is not kept"):
        check_with_evaluator(spec)
    for key in ("ema", "use_ema"):  # trainer's key, and Keras's own passed on
        spec = resolve(make_config(f"+optimizer.{key}=true" if key == "use_ema"
                                   else f"optimizer.{key}=true"))
        with pytest.raises(ConfigError, match=rf"^optimizer\.{key}=true is not kept with an "
                                              "evaluator: .* set optimizer"):
            check_with_evaluator(spec)
    spec = resolve(make_config())
    check_with_evaluator(spec)
    assert spec.checkpoint.save_best and not without_validation(spec).checkpoint.save_best


def test_the_launcher_gives_the_evaluator_its_task_and_the_chiefs_run_dir(tmp_path):
    configs = [json.loads(c) for c in tf_configs(["h:1", "h:2"], "h:3")]
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 0},
                                           {"type": "worker", "index": 1},
                                           {"type": "evaluator", "index": 0}]
    assert all(c["cluster"] == {"worker": ["h:1", "h:2"], "evaluator": ["h:3"]}
               for c in configs)
    commands = worker_commands(2, ["epochs=2"], "runs/x", tmp_path, evaluator=True)
    assert len(commands) == 3
    assert commands[2][-1] == commands[0][-1] == "hydra.run.dir=runs/x"
    assert "hydra.run.dir=runs/x" not in commands[1]
    assert tf_configs(["h:1"]) == [json.dumps({"cluster": {"worker": ["h:1"]},
                                               "task": {"type": "worker", "index": 0}})]


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines.append(text)

    def flush(self) -> None:
        pass


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_an_evaluator_that_fails_does_not_stop_the_workers():
    out = _Out()
    launcher = Launcher([_python("import time; time.sleep(1)"), _python("raise SystemExit(3)")],
                        [dict(os.environ)] * 2, grace=5, out=out, evaluator=True)
    launcher.start()
    assert launcher.wait() == 0
    assert launcher.procs[0].returncode == 0  # it slept its second, untouched
    assert "the evaluator stopped with exit code 3" in "".join(out.lines)


def test_an_evaluator_that_does_not_end_with_the_run_is_stopped():
    out = _Out()
    launcher = Launcher([_python("pass"), _python("import time; time.sleep(60)")],
                        [dict(os.environ)] * 2, grace=0.5, out=out, evaluator=True)
    launcher.start()
    assert launcher.wait() == 0
    assert launcher.procs[1].returncode is not None
    assert "the evaluator did not end with the run; stopping it" in "".join(out.lines)


@pytest.mark.multiworker
def test_two_workers_and_an_evaluator(tmp_path, launches, tiny_config):
    """The issue's measure: 2 workers and an evaluator end with the weights of a run that
    validates itself (1 device, the same global batch), the validation history the
    evaluator's, each record what `trainer.evaluate` gives for that epoch's checkpoint."""
    from trainer.evaluate import evaluate_run

    run_dir = tmp_path / "run"
    batch = ["batch.per_replica=null", "batch.global_size=64", "optimizer.lr=0.01", "epochs=2"]
    launch = launches(2, *multiworker.COMMON, *batch, "logger=[tensorboard]",
                      "--evaluator", f"hydra.run.dir={run_dir}")
    assert launch.wait(timeout=300) == 0, launch.output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    validated = summary["validated_by"]
    assert validated["complete"] and validated["epochs"] == [1, 2], validated
    assert re.search(r"\[worker 0\]   validated by +the evaluator \(2 epochs; best.keras is "
                     rf"epoch {validated['best']['epoch']}\)", launch.output)
    # the workers validated nothing: their epoch lines log no val_ metric
    assert [line for line in launch.output.splitlines()
            if line.startswith("[worker") and "val_" in line] == []
    records = [json.loads(line) for line in
               (run_dir / "evaluator" / "history.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2]
    assert summary["history"]["val_loss"] == [r["val_loss"] for r in records]
    # each epoch's record is what trainer.evaluate gives for that epoch's checkpoint
    last = evaluate_run(run_dir, ["checkpoint=last"])["metrics"]
    best = evaluate_run(run_dir, ["checkpoint=best"])["metrics"]
    chosen = max(records, key=lambda r: (r["val_accuracy"], -r["epoch"]))
    assert validated["best"]["epoch"] == chosen["epoch"]
    for record, found in ((records[-1], last), (chosen, best)):
        for name, value in found.items():
            assert record[f"val_{name}"] == pytest.approx(value, abs=1e-6), name
    test = evaluate_run(run_dir, ["checkpoint=best", "split=test"])["metrics"]
    assert summary["test_checkpoint"] == str(run_dir / "checkpoints" / "best.keras")
    for name, value in test.items():
        assert summary["test_metrics"][name] == pytest.approx(value, abs=1e-6), name
    assert list((run_dir / "tensorboard" / "validation").iterdir())
    assert not (run_dir / "evaluator" / "inbox").exists()
    # the same weights as without an evaluator (validating in the run itself)
    expected = multiworker.reference(tmp_path, tiny_config, "one", *batch)
    multiworker.assert_same_weights(run_dir, expected, atol=1e-5)



@pytest.mark.multiworker
@pytest.mark.parametrize("refused, line", [
    ("optimizer.ema=true", "error: optimizer.ema=true is not kept with an evaluator"),
    ("checkpoint.monitor=val_top5", "error: checkpoint.monitor='val_top5' is not logged by "
                                    "this run; valid: loss, accuracy, val_loss, val_accuracy")])
def test_what_the_evaluator_refuses_the_workers_refuse_before_training(
        tmp_path, launches, refused, line):
    """EMA trained every epoch, then crashed in the averaged model's test, in a loop of
    relaunches; a monitor the run does not log was the evaluator's refusal alone, after the
    workers trained (they keep no best checkpoint). One worker keeps it cheap."""
    launch = launches(1, *multiworker.COMMON, "epochs=1", refused, "--evaluator",
                      f"hydra.run.dir={tmp_path / 'run'}")
    assert launch.wait(timeout=240) == 2, launch.output[-3000:]
    assert f"[worker 0] {line}" in launch.output, launch.output[-3000:]
    assert "Epoch 1" not in launch.output and "epoch 1" not in launch.output
    assert not (tmp_path / "run" / "backup").exists()


@pytest.mark.multiworker
def test_an_evaluator_killed_mid_run_leaves_training_going(tmp_path, launches):
    """SIGKILL to the evaluator after its first epoch: the workers finish, the chief stops
    waiting once the evaluator is silent (`STALE_S`), and the summary says validation was
    incomplete; no process is left behind."""
    import signal
    import time

    run_dir = tmp_path / "run"
    launch = launches(2, *multiworker.SIGNALLED, "epochs=3", "--evaluator",
                      f"hydra.run.dir={run_dir}")
    multiworker.wait_for(lambda: "[evaluator] evaluator: epoch 1:" in launch.output, 240,
                         launch, "the evaluator's first epoch")
    pid = int(re.search(r"\[launch\] evaluator: pid (\d+)", launch.output).group(1))
    os.killpg(pid, signal.SIGKILL)
    began = time.monotonic()
    assert launch.wait(timeout=300) == 0, launch.output[-3000:]
    assert time.monotonic() - began < 200  # not the whole strategy.start_timeout_s (300 s)
    assert "the evaluator stopped with SIGKILL; the workers train on" in launch.output
    validated = json.loads((run_dir / "summary.json").read_text())["validated_by"]
    assert not validated["complete"] and "no sign of life" in validated["why"], validated
    assert re.search(r"\[worker 0\]   validated by +the evaluator, incomplete: the "
                     r"evaluator stopped \(no sign of life", launch.output)


def _term_before_the_last_step():
    """A callback that sends SIGTERM to this process after the second-to-last step of the
    first epoch: the stop is then asked at its last step."""
    import signal

    import keras

    class Term(keras.callbacks.Callback):
        sent = False

        def on_train_batch_end(self, batch, logs=None):
            if not self.sent and batch == self.params["steps"] - 2:
                self.sent = True
                os.kill(os.getpid(), signal.SIGTERM)

    return Term()


def test_a_stop_at_an_epochs_last_step_still_ends_that_epoch(tmp_path, tiny_config):
    """Stopped at the last step, a resume began the next epoch: that epoch was never
    validated (nor handed to an evaluator), its metrics missing from the history."""
    from trainer.config.errors import Interrupted
    from trainer.run.train import train

    cfg = tiny_config("epochs=2")
    alone = train(cfg, run_dir=tmp_path / "alone")
    with pytest.raises(Interrupted, match="stopped by signal 15 at epoch 1"):
        train(cfg, run_dir=tmp_path / "cut", callbacks=[_term_before_the_last_step()])
    # the epoch's end was backed up, the evaluator's hand-off reads it (`Backup.ended`)
    assert [p.name for p in (tmp_path / "cut" / "backup").iterdir()
            if p.name.startswith("ckpt-")] == ["ckpt-000001-000000000"]
    again = train(cfg, run_dir=tmp_path / "cut")
    assert again["history"] == alone["history"]


def test_the_hand_off_gives_the_evaluator_an_epoch_whose_end_was_backed_up_before_a_stop(
        tmp_path):
    """The epoch a stop at its last step ended is handed over, though the run stops; an
    epoch whose end no backup holds (a stop mid-epoch) is not."""
    from types import SimpleNamespace

    from trainer.run.assembly.callbacks import HandOff
    from trainer.rundir.backup import WEIGHTS, BackupStore

    store = BackupStore(tmp_path / "backup")
    store.path(1).mkdir(parents=True)
    (store.path(1) / WEIGHTS).write_bytes(b"weights")
    backup = SimpleNamespace(store=store, ended={1}, interrupted=True)
    place = EvaluatorDir.of(tmp_path)
    handoff = HandOff(backup, place)
    handoff.on_epoch_end(0, {"loss": 1.5})
    handoff.on_epoch_end(1, {"loss": 1.0})  # epoch 2: stopped inside it, no backup of its end
    assert ready_epochs(place.inbox) == [1]
    assert json.loads(place.logs(1).read_text()) == {"loss": 1.5}


def test_a_dataset_with_no_validation_split_is_refused_with_an_evaluator_before_training():
    """The evaluator refused it only once the workers were training; the workers check it
    as they assemble the run (the monitor's check is the launched test's above)."""
    from types import SimpleNamespace

    from trainer.run.assembly.assemble import Run

    saving = SimpleNamespace(monitor="val_accuracy", mode="auto")
    unvalidated = SimpleNamespace(data=SimpleNamespace(validation=None))
    with pytest.raises(ConfigError, match="^the dataset has no validation split: there is "
                                          "nothing for an evaluator to validate"):
        Run.check_evaluable(unvalidated, saving)
    modes = []
    validated = SimpleNamespace(data=SimpleNamespace(validation=object()),
                                monitor_mode=lambda *args: modes.append(args))
    Run.check_evaluable(validated, saving)
    assert modes == [("val_accuracy", "auto")]
