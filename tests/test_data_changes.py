"""A run knows its data: a fingerprint of each role is kept in its backups and summary; a
rerun or an evaluation on changed data is one line naming what changed; checkpoints whose
backup/ is gone are not trained over."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from omegaconf import OmegaConf

from tests.conftest import error_lines, make_config, run_main
from tests.test_data import write_images
from trainer.config.errors import ConfigError
from trainer.data import fingerprint
from trainer.run.train import train

FOLDER = ["dataset=image_folder", "dataset.image_size=8", "epochs=1", "verbose=0",
          "logger=[]", "batch.per_replica=4"]


def _more_images(folder, per_class=2):
    for name in ("cat", "dog"):
        for i in range(per_class):
            shutil.copy(folder / name / "1.png", folder / name / f"extra{i}.png")


def test_an_image_folder_that_gained_files_is_refused_on_resume_and_in_evaluate(tmp_path,
                                                                                 capsys):
    from trainer.evaluate import main as evaluate

    images, run_dir = tmp_path / "images", tmp_path / "run"
    write_images(images)
    cfg = make_config(*FOLDER, f"dataset.path={images}")
    summary = train(cfg, run_dir)
    assert summary["data"]["train"]["examples"] == 16
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    _more_images(images)
    more = make_config(*FOLDER, f"dataset.path={images}", "epochs=2", f"resume={run_dir}")
    with pytest.raises(ConfigError, match=rf"the data of {run_dir} changed since it trained: "
                                          r"train had 16 examples, now 20; validation has the "
                                          r"same number of examples \(2\) with other contents; "
                                          r"test .*restore the data"):
        train(more)
    assert evaluate([str(run_dir)]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "changed since it trained: train had 16" in lines[0], lines


def test_the_same_folder_resumes_and_evaluates(tmp_path):
    from trainer.evaluate import evaluate_run

    images, run_dir = tmp_path / "images", tmp_path / "run"
    write_images(images)
    cfg = make_config(*FOLDER, f"dataset.path={images}")
    train(cfg, run_dir)
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    assert evaluate_run(run_dir)["examples"] == 2
    more = make_config(*FOLDER, f"dataset.path={images}", "epochs=2", f"resume={run_dir}")
    assert train(more)["epochs_done"] == 2


def test_checkpoints_whose_backup_was_removed_are_not_trained_over(tmp_path):
    run_dir = tmp_path / "run"
    tiny = ["epochs=1", "verbose=0", "dataset.image_size=8", "logger=[]"]
    train(make_config(*tiny), run_dir)
    shutil.rmtree(run_dir / "backup")
    (run_dir / "summary.json").unlink()
    before = sorted(p.name for p in run_dir.rglob("*"))
    result = run_main(*tiny, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 2
    lines = error_lines(result.stderr)
    assert lines == [f"error: {run_dir} holds checkpoints but its backup/ is gone, so the run "
                     "cannot continue where it was; move the directory away (or remove its "
                     "checkpoints/) to start afresh, or choose a new run directory"]
    assert sorted(p.name for p in run_dir.rglob("*")) == before
    with pytest.raises(ConfigError, match="backup/ is gone"):
        train(make_config(*tiny), run_dir)


def test_fingerprints_see_a_change_of_content_and_of_count():
    x = np.arange(60, dtype=np.float32).reshape(20, 3)
    y = np.arange(20)
    base = {"train": fingerprint.of_arrays(x, y)}
    assert fingerprint.changes(base, {"train": fingerprint.of_arrays(x.copy(), y)}) == []
    changed = x.copy()
    changed[7, 1] += 1
    assert fingerprint.changes(base, {"train": fingerprint.of_arrays(changed, y)}) == [
        "train has the same number of examples (20) with other contents"]
    assert fingerprint.changes(base, {"train": fingerprint.of_arrays(x[:19], y[:19])}) == [
        "train had 20 examples, now 19"]
    assert fingerprint.changes(None, base) == []  # a run from before fingerprints
    named = {"num": x, "cat": y}
    assert fingerprint.of_arrays(named, y) == fingerprint.of_arrays(dict(reversed(
        named.items())), y)


def test_large_arrays_are_sampled_not_read_whole(monkeypatch):
    monkeypatch.setattr(fingerprint, "FULL_BYTES", 1 << 12)
    monkeypatch.setattr(fingerprint, "SAMPLE_BYTES", 64)
    big = np.zeros((4096, 4), np.float32)
    first = fingerprint.of_arrays(big)
    big[0, 0] = 1  # inside the first sample
    assert fingerprint.of_arrays(big) != first
