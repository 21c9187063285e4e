"""A run's checkpoint loads in a fresh process: with Keras alone where it holds only Keras's
objects (a default run's, a warm-up and cosine decay's), through
`trainer.evaluate.load_checkpoint` where it holds a user's loss function (#35)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.conftest import REPO, TINY, error_lines, run_main
from trainer.evaluate import load_checkpoint
from trainer.plan.schedule import WarmupSchedule
from trainer.run.train import train

# Loads each checkpoint with Keras alone, in a process that never imports trainer.
KERAS_ONLY = textwrap.dedent("""
    import json, sys
    import numpy as np
    import keras
    x = np.load(sys.argv[1])
    found = {}
    for name, path in json.loads(sys.argv[2]).items():
        model = keras.models.load_model(path)
        found[name] = {"outputs": model.predict(x, verbose=0).tolist(),
                       "iterations": int(model.optimizer.iterations),
                       "lr": float(model.optimizer.learning_rate)}
    assert not [m for m in sys.modules if m.split(".")[0] == "trainer"], "trainer imported"
    print(json.dumps(found))
""")


def _fresh(code: str, *args: str, cwd, pythonpath: str | None = None):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_default_runs_checkpoint_loads_with_keras_alone(tiny_config, tmp_path):
    """The default run (a constant rate) and one with warm-up and cosine decay: plain
    `keras.models.load_model` in a process without trainer gives the run's outputs, and the
    optimizer's rate at its iteration is the run's schedule's there (the small network
    there: the schedule is what that run adds)."""
    runs = {"default": (1, ["model=cnn"]),
            "cosine": (2, ["model=small", "optimizer=sgd_momentum_cosine",
                           "optimizer.warmup_epochs=0.5"])}
    checkpoints, summaries = {}, {}
    for name, (epochs, overrides) in runs.items():
        summaries[name] = train(tiny_config(*overrides, f"epochs={epochs}"),
                                run_dir=tmp_path / name)
        checkpoints[name] = str(tmp_path / name / "checkpoints" / "best.keras")
    assert summaries["default"]["checkpoints_load_with"] == "keras.models.load_model"
    assert summaries["cosine"]["learning_rate"]["schedule"] == "CosineDecay"
    x = np.random.default_rng(0).random((5, 8, 8, 1), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    done = _fresh(KERAS_ONLY, str(tmp_path / "x.npy"), json.dumps(checkpoints), cwd=tmp_path)
    assert done.returncode == 0, error_lines(done.stderr)[-20:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for name, summary in summaries.items():
        expected = load_checkpoint(checkpoints[name]).predict(x, verbose=0)
        np.testing.assert_allclose(found[name]["outputs"], expected, rtol=1e-5, atol=1e-7)
        lr, steps = summary["learning_rate"], summary["steps_per_epoch"]
        assert found[name]["iterations"] in [steps * (e + 1) for e in range(runs[name][0])]
        schedule = WarmupSchedule(lr["base"], lr["scaled"], lr["warmup_steps"],
                                  steps * runs[name][0], lr["decay"])
        assert found[name]["lr"] == pytest.approx(
            float(schedule(found[name]["iterations"])), rel=1e-6, abs=1e-9)


USERS_LOSS = textwrap.dedent("""
    import keras

    def my_loss(y_true, y_pred):
        return 2.0 * keras.losses.sparse_categorical_crossentropy(y_true, y_pred)
""")

# trainer's loader in a fresh process, first without the user's module on the path (one
# line), then as the user has it (PYTHONPATH): the run's config names the loss it registers.
THROUGH_TRAINER = textwrap.dedent("""
    import json, sys
    import numpy as np
    from trainer.config.errors import ConfigError
    from trainer.evaluate import load_checkpoint
    try:
        load_checkpoint(sys.argv[1])
        refused = None
    except ConfigError as error:
        refused = str(error)
    sys.path.insert(0, sys.argv[3])
    model = load_checkpoint(sys.argv[1])
    x = np.load(sys.argv[2])
    print(json.dumps({"refused": refused, "loss": model.loss.fn.__module__ + "."
                      + model.loss.fn.__name__,
                      "outputs": model.predict(x, verbose=0).tolist()}))
""")


def test_a_users_loss_by_dotted_name_loads_through_trainers_loader(tmp_path, monkeypatch):
    """`loss=loss_task.my_loss` from the user's folder: plain Keras cannot know the function,
    `trainer.evaluate.load_checkpoint` can (the run's config names it) wherever the module
    imports; where it does not, one line."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "loss_task.py").write_text(USERS_LOSS)
    monkeypatch.syspath_prepend(str(project))
    run_dir = tmp_path / "run"
    done = run_main(*TINY, "loss=loss_task.my_loss", "accelerator=cpu", "devices=1",
                    f"hydra.run.dir={run_dir}", cwd=project)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["checkpoints_load_with"].startswith(
        "trainer.evaluate.load_checkpoint (they hold loss_task>my_loss")
    checkpoint = run_dir / "checkpoints" / "best.keras"
    x = np.random.default_rng(0).random((5, 8, 8, 1), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _fresh(THROUGH_TRAINER, str(checkpoint), str(tmp_path / "x.npy"), str(project),
                  cwd=elsewhere, pythonpath=str(REPO))
    assert done.returncode == 0, error_lines(done.stderr)[-20:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["refused"].startswith("loss 'loss_task.my_loss' cannot be imported: ")
    assert "\n" not in found["refused"]
    assert found["loss"] == "loss_task.my_loss"
    expected = load_checkpoint(checkpoint).predict(x, verbose=0)
    np.testing.assert_allclose(found["outputs"], expected, rtol=1e-5, atol=1e-7)
