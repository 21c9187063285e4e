"""Composing a config never touches Hydra's process-wide state: two `trainer.fit` calls in
two threads compose at once, and a user's own Hydra app (its `GlobalHydra` initialized) can
call `trainer.fit` and `trainer.evaluate` and keep its state."""

from __future__ import annotations

import threading

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from trainer.config.compose import compose_from_args, compose_in
from trainer.config.schema import config_dir

TINY = ["epochs=1", "verbose=0", "dataset.image_size=8", "logger=[]", "model=small"]


def test_compositions_in_several_threads_at_once_all_succeed():
    start = threading.Barrier(4)
    found, failed = [], []

    def compose_three(seed):
        try:
            start.wait(60)
            for _ in range(3):
                found.append((seed, compose_from_args([f"seed={seed}", "epochs=2"]).seed))
        except BaseException as error:  # noqa: BLE001 - reported by the test
            failed.append(repr(error))

    threads = [threading.Thread(target=compose_three, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failed == []
    assert sorted(found) == sorted((seed, seed) for seed in range(4) for _ in range(3))


def test_a_users_hydra_app_keeps_its_global_hydra_through_a_composition(tmp_path):
    (tmp_path / "mine.yaml").write_text("answer: 42\n")
    with initialize_config_dir(str(tmp_path), version_base="1.3"):
        users = GlobalHydra.instance().hydra
        cfg = compose_from_args(["epochs=3"])
        run = compose_in(str(config_dir()), "config", ["seed=5"])
        assert GlobalHydra.instance().is_initialized()
        assert GlobalHydra.instance().hydra is users
        assert compose("mine").answer == 42  # the user's app composes on as before
    assert cfg.epochs == 3 and "hydra" in cfg
    assert run.seed == 5 and "hydra" not in run


def test_compose_in_gives_what_hydras_compose_api_gives():
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        expected = compose("config", overrides=["seed=5", "dataset.image_size=8"])
    assert compose_in(str(config_dir()), "config", ["seed=5", "dataset.image_size=8"]) == \
        expected


def test_fit_and_evaluate_inside_a_users_hydra_app(tmp_path):
    import trainer

    (tmp_path / "mine.yaml").write_text("answer: 42\n")
    with initialize_config_dir(str(tmp_path), version_base="1.3"):
        users = GlobalHydra.instance().hydra
        result = trainer.fit(TINY, run_dir=tmp_path / "run")
        evaluated = trainer.evaluate(result.run_dir)
        assert GlobalHydra.instance().hydra is users
    assert result.summary["epochs_done"] == 1
    assert evaluated["metrics"]["accuracy"] == result.summary["validation_metrics"]["accuracy"]


def test_a_composition_is_the_command_lines_and_leaves_hydras_settings_as_they_were(tmp_path):
    from hydra.core.utils import JobRuntime
    from hydra.version import getbase

    with initialize_config_dir(str(tmp_path), version_base="1.2", job_name="users_job"):
        cfg = compose_from_args(["epochs=3"])
        assert JobRuntime.instance().get("name") == "users_job"
        assert str(getbase()) == "1.2"
    assert cfg.hydra.job.name == "trainer" and cfg.hydra.runtime.version_base == "1.3"
