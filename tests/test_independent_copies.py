"""No two names in a run directory share storage: `best.keras`, `last.keras`, the k best and
the newest backup's `model.keras` are files of their own, so damage to one, or a user's
overwrite of it, changes no other; and a checksum file that holds no checksum is named as the
damaged one, not the checkpoint beside it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import keras
import pytest

from tests.conftest import error_lines, run_main

# 8x8 digits, 2 epochs whose last is the best (val_loss falls): last.keras, best.keras, one of
# the k best and the epoch-2 backup all hold the same state, which a run once wrote once and
# hard-linked to the other names.
ARGS = ["epochs=2", "verbose=0", "dataset.image_size=8", "logger=[]", "deterministic=true",
        "checkpoint.monitor=val_loss", "checkpoint.keep_best=2"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished run of the command line (its `.hydra/` kept, so evaluate and resume can
    read it)."""
    root = tmp_path_factory.mktemp("copies")
    run_dir = root / "run"
    result = run_main(*ARGS, f"hydra.run.dir={run_dir}", cwd=root)
    assert result.returncode == 0, result.stderr
    return run_dir


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of the run, hard links kept as they are (`cp -a`)."""
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(run_dir), str(copy)], check=True)
    return copy


def _damage(path: Path) -> None:
    """64 bytes of zeros in the middle of `path`, written in place (as a bad disk would)."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\0" * 64)


def _hashes(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_after_a_run_no_two_files_share_an_inode(finished):
    files = [p for p in finished.rglob("*") if p.is_file()]
    keras_files = [p for p in files if p.suffix == ".keras"]
    names = {p.name for p in keras_files}
    # the state of epoch 2 is under four names: each is a file of its own
    assert {"best.keras", "last.keras", "model.keras"} <= names
    assert any(name.startswith("best-epoch002-") for name in names), names
    assert len({p.stat().st_ino for p in keras_files}) == len(keras_files)
    assert [str(p) for p in files if p.stat().st_nlink != 1] == []
    # the newest backup (a finished run keeps two) holds the best epoch's checkpoint, copied
    backup = max((finished / "backup").glob("ckpt-*/model.keras"))
    assert (hashlib.sha256(backup.read_bytes()).hexdigest() == hashlib.sha256(
        (finished / "checkpoints" / "best.keras").read_bytes()).hexdigest())


def test_a_damaged_best_leaves_evaluate_last_and_resume_working(finished, tmp_path, capsys):
    from trainer.evaluate import main

    copy = _copy(finished, tmp_path)
    best = copy / "checkpoints" / "best.keras"
    _damage(best)
    assert main([str(copy), "checkpoint=last"]) == 0, capsys.readouterr().err
    assert main([str(copy)]) == 2  # best.keras itself is found damaged, and said so
    assert f"{best} is damaged" in capsys.readouterr().err
    resumed = run_main(*ARGS, "epochs=3", f"resume={copy}", f"hydra.run.dir={copy}",
                       cwd=tmp_path)
    assert resumed.returncode == 0, error_lines(resumed.stderr)[-3:]
    assert json.loads((copy / "summary.json").read_text())["epochs_done"] == 3


def test_a_user_overwriting_best_changes_no_other_file(finished, tmp_path):
    copy = _copy(finished, tmp_path)
    best = copy / "checkpoints" / "best.keras"
    before = _hashes(copy)
    model = keras.saving.load_model(best, compile=False)
    model.set_weights([w * 0 for w in model.get_weights()])
    model.save(best)  # a user's own script, writing in place
    after = _hashes(copy)
    changed = sorted(name for name in before if after.get(name) != before[name])
    assert changed == ["checkpoints/best.keras"]


def test_a_garbage_checksum_file_is_named_and_not_the_checkpoint(finished, tmp_path, capsys):
    from trainer.evaluate import main

    copy = _copy(finished, tmp_path)
    last = copy / "checkpoints" / "last.keras"
    Path(f"{last}.sha256").write_text("not a checksum\n")
    assert main([str(copy), "checkpoint=last"]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1, lines
    assert f"the checksum file {last}.sha256 is damaged" in lines[0]
    assert f"{last} is damaged" not in lines[0]


def test_the_writer_leaves_nothing_of_a_failed_write_and_copies_bytes(tmp_path):
    from trainer.rundir.atomic import copy, written
    from trainer.rundir.checksum import read_beside, sha256

    path = tmp_path / "a" / "file.bin"
    with pytest.raises(RuntimeError), written(path, checksum=True) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("killed")
    assert sorted(os.listdir(path.parent)) == []
    with written(path, checksum=True) as tmp:
        tmp.write_bytes(b"whole")
    assert read_beside(path) == sha256(path)
    copied = copy(path, tmp_path / "b.bin", read_beside(path))
    assert copied == sha256(path) and (tmp_path / "b.bin").read_bytes() == b"whole"
    assert (tmp_path / "b.bin").stat().st_ino != path.stat().st_ino
    assert sorted(os.listdir(path.parent)) == ["file.bin", "file.bin.sha256"]
