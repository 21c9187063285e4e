"""A run knows its data: a fingerprint of each role is kept in its backups and summary; a
rerun or an evaluation on changed data is one line naming what changed; checkpoints whose
backup/ is gone are not trained over."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest
from omegaconf import OmegaConf

from tests.conftest import error_lines, make_config, run_main
from tests.test_data import write_images
from trainer.config.errors import ConfigError
from trainer.data import fingerprint
from trainer.run.train import train

FOLDER = ["dataset=image_folder", "dataset.image_size=8", "epochs=1", "verbose=0",
          "logger=[]", "batch.per_replica=4", "model=small"]


def _more_images(folder, per_class=2):
    for name in ("cat", "dog"):
        for i in range(per_class):
            shutil.copy(folder / name / "1.png", folder / name / f"extra{i}.png")


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    """A finished run on an image folder, its config saved as the command line saves it:
    (images, run directory). The tests work on copies of the run; one that changes the
    images puts them back."""
    root = tmp_path_factory.mktemp("folder")
    images, run_dir = root / "images", root / "run"
    write_images(images)
    cfg = make_config(*FOLDER, f"dataset.path={images}")
    summary = train(cfg, run_dir)
    assert summary["data"]["train"]["examples"] == 16
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    return images, run_dir


def _copy(run_dir, tmp_path):
    """The shared run's copy, every file's bytes and times kept."""
    copy = tmp_path / "run"
    subprocess.run(["cp", "-a", str(run_dir), str(copy)], check=True)
    return copy


@pytest.mark.xdist_group("test_data_changes.folder_run")
def test_an_image_folder_that_gained_files_is_refused_on_resume_and_in_evaluate(
        folder_run, tmp_path, capsys):
    from trainer.evaluate import main as evaluate

    images, shared = folder_run
    run_dir = _copy(shared, tmp_path)
    _more_images(images)
    try:
        more = make_config(*FOLDER, f"dataset.path={images}", "epochs=2", f"resume={run_dir}")
        with pytest.raises(ConfigError, match=rf"the data of {run_dir} changed since it "
                                              r"trained: train had 16 examples, now 20; "
                                              r"validation has the same number of examples "
                                              r"\(2\) with other contents; test .*restore "
                                              r"the data"):
            train(more)
        assert evaluate([str(run_dir)]) == 2
    finally:
        for extra in images.glob("*/extra*"):
            extra.unlink()
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "changed since it trained: train had 16" in lines[0], lines


@pytest.mark.xdist_group("test_data_changes.folder_run")
def test_the_same_folder_resumes_and_evaluates(folder_run, tmp_path):
    from trainer.evaluate import evaluate_run

    images, shared = folder_run
    run_dir = _copy(shared, tmp_path)
    assert evaluate_run(run_dir)["examples"] == 2
    more = make_config(*FOLDER, f"dataset.path={images}", "epochs=2", f"resume={run_dir}")
    assert train(more)["epochs_done"] == 2


def test_checkpoints_whose_backup_was_removed_are_not_trained_over(tmp_path):
    run_dir = tmp_path / "run"
    tiny = ["epochs=1", "verbose=0", "dataset.image_size=8", "logger=[]", "model=small"]
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


def _png(path, value, shape=(6, 5, 3)):
    """An uncompressed PNG: its size depends on its shape alone, not on its pixels."""
    import zlib

    height, width, _ = shape
    rows = b"".join(b"\x00" + bytes([value % 256]) * (width * 3) for _ in range(height))
    def chunk(kind, data):
        return (len(data).to_bytes(4, "big") + kind + data
                + zlib.crc32(kind + data).to_bytes(4, "big"))
    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                     + chunk(b"IDAT", zlib.compress(rows, 0)) + chunk(b"IEND", b""))


def _folder(root, per_class=4):
    """Two class folders of same-size PNGs, `0.png`, `1.png`, ... in each; their files."""
    for c, name in enumerate(("cat", "dog")):
        for i in range(per_class):
            _png(root / name / f"{i}.png", 40 * c + 7 * i + 1)
    return _files(root, per_class)


def _files(root, per_class=4):
    return {"train": [(str(root / name / f"{i}.png"), c) for c, name in enumerate(("cat", "dog"))
                      for i in range(per_class)]}


def _swap(a, b):
    a.rename(a.with_name("swap.tmp"))
    b.rename(a)
    a.with_name("swap.tmp").rename(b)


def test_file_fingerprints_hash_contents_and_reread_only_changed_files(tmp_path, monkeypatch):
    import time

    monkeypatch.setenv("TRAINER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)  # files just written may be cached
    root = tmp_path / "images"
    files = _folder(root)
    time.sleep(0.05)  # past the file system's clock tick

    def take():
        cache = fingerprint.HashCache(str(root))
        return fingerprint.of_folder(files, str(root), cache), cache

    cold, cache = take()
    assert (cache.hashed, cache.reused) == (8, 0)
    warm, cache = take()
    assert warm == cold and (cache.hashed, cache.reused) == (0, 8)
    listed = {path: os.stat(path) for path, _ in files["train"]}  # as image_folder lists
    assert fingerprint.of_folder(files, str(root), stats=listed) == cold
    # two files of one name and size swapped between class folders: new inodes, re-read
    assert (root / "cat" / "1.png").stat().st_size == (root / "dog" / "1.png").stat().st_size
    _swap(root / "cat" / "1.png", root / "dog" / "1.png")
    swapped, cache = take()
    assert (cache.hashed, cache.reused) == (2, 6)
    assert swapped["train"]["sha256"] == cold["train"]["sha256"]  # names, sizes, classes
    assert fingerprint.changes(cold, swapped) == [
        "train has the same number of examples (8) with other contents"]
    _swap(root / "cat" / "1.png", root / "dog" / "1.png")
    assert take()[0] == cold
    # a same-size rewrite whose mtime is set back: its ctime moved, so it is read again
    time.sleep(0.05)
    path = root / "cat" / "2.png"
    before = path.stat()
    _png(path, 200)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size
    rewritten, cache = take()
    assert cache.hashed == 1 and fingerprint.changes(cold, rewritten) != []


def test_a_fingerprint_from_before_content_hashes_compares_what_both_have(tmp_path):
    root = tmp_path / "images"
    now = fingerprint.of_folder(_folder(root), str(root))
    old = {"train": {k: v for k, v in now["train"].items() if k != "content"}}
    assert fingerprint.changes(old, now) == []
    _swap(root / "cat" / "1.png", root / "dog" / "1.png")  # what an old backup cannot see
    assert fingerprint.changes(old, fingerprint.of_folder(_files(root), str(root))) == []
    old["train"]["examples"] = 9
    assert fingerprint.changes(old, now) == ["train had 9 examples, now 8"]


def test_the_same_folder_spelled_another_way_has_the_same_fingerprint(tmp_path, monkeypatch):
    root = tmp_path / "images"
    files = _folder(root)
    (tmp_path / "link").symlink_to(root)
    monkeypatch.chdir(tmp_path)
    spelled = {"train": [(os.path.join("link", os.path.relpath(p, root)), c)
                         for p, c in files["train"]]}
    assert fingerprint.of_folder(spelled, "link") == fingerprint.of_folder(files, str(root))


FOLDER_RESUME = [*FOLDER, "epochs=1", "dataset.validation_fraction=0.25",
                 "dataset.test_fraction=0"]


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A run on a folder of same-size PNGs, as if stopped before its end (a resume continues
    it), its config saved: (images, run directory). Trained with the folder's hashes cached
    (the files older than the cache's caution). The tests work on copies of the run; one
    that changes the images puts them back."""
    root = tmp_path_factory.mktemp("stopped")
    images, run_dir = root / "images", root / "run"
    _folder(images, per_class=8)
    cfg = make_config(*FOLDER_RESUME, f"dataset.path={images}")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fingerprint, "RACY_NS", 0)
        train(cfg, run_dir)
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    (run_dir / "summary.json").unlink()  # as if stopped before its end
    return images, run_dir


@pytest.mark.xdist_group("test_data_changes.stopped_run")
def test_a_same_size_swap_between_class_folders_is_refused_on_resume_and_in_evaluate(
        stopped_run, tmp_path, capsys, monkeypatch):
    """With the hashes cached (the folder older than the cache's caution), so the swap is
    found by its changed inodes, not by a cold read."""
    from trainer.evaluate import main as evaluate

    monkeypatch.setattr(fingerprint, "RACY_NS", 0)
    images, shared = stopped_run
    run_dir = _copy(shared, tmp_path)
    more = make_config(*FOLDER_RESUME, f"dataset.path={images}", "epochs=2")
    _swap(images / "cat" / "3.png", images / "dog" / "3.png")
    try:
        before = _every_byte(run_dir)
        with pytest.raises(ConfigError, match=rf"the data of {run_dir} changed since it "
                                              r"trained: (train|validation) has the same "
                                              r"number of examples \(\d+\) with other "
                                              r"contents"):
            train(more, run_dir)
        assert _every_byte(run_dir) == before  # .lock's bytes and times included
        assert evaluate([str(run_dir)]) == 2
    finally:
        _swap(images / "cat" / "3.png", images / "dog" / "3.png")
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "with other contents" in lines[0], lines
    assert train(more, run_dir)["epochs_done"] == 2


def _every_byte(run_dir):
    """Each file's bytes and mtime_ns, by path (the lock file too)."""
    return {str(p.relative_to(run_dir)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.mark.xdist_group("test_data_changes.stopped_run")
def test_a_backup_from_before_content_hashes_resumes(stopped_run, tmp_path):
    import json

    images, shared = stopped_run
    run_dir = _copy(shared, tmp_path)
    for state in (run_dir / "backup").glob("ckpt-*/state.json"):
        kept = json.loads(state.read_text())
        for role in kept["data"].values():
            del role["content"]  # as a backup made before content hashes has it
        state.write_text(json.dumps(kept))
    more = make_config(*FOLDER_RESUME, f"dataset.path={images}", "epochs=2")
    assert train(more, run_dir)["epochs_done"] == 2


def test_a_rerun_refused_for_changed_data_leaves_every_file_as_it_was_cli_and_api(
        tmp_path, monkeypatch):
    """The data is checked once the source is built, after Hydra's job (the command line) and
    fit wrote .hydra/: a rerun in the directory keeps its .hydra/ until the check passed."""
    import trainer

    images = tmp_path / "images"
    write_images(images)
    args = [*FOLDER, f"dataset.path={images}"]
    cli, api = tmp_path / "cli", tmp_path / "api"
    assert run_main(*args, f"hydra.run.dir={cli}", cwd=tmp_path).returncode == 0
    trainer.fit(args, run_dir=api)
    for run_dir in (cli, api):
        (run_dir / "summary.json").unlink()  # as if stopped: a rerun continues it
    _more_images(images)
    before = {run_dir: _every_byte(run_dir) for run_dir in (cli, api)}
    assert ".hydra/config.yaml" in before[cli] and ".hydra/config.yaml" in before[api]
    out = run_main(*args, "epochs=2", f"hydra.run.dir={cli}", cwd=tmp_path)
    assert out.returncode == 2 and len(error_lines(out.stderr)) == 1, out.stderr
    assert f"the data of {cli} changed since it trained" in out.stderr
    with pytest.raises(trainer.TrainerError, match=f"the data of {api} changed since it"):
        trainer.fit([*args, "epochs=2"], run_dir=api)
    monkeypatch.chdir(tmp_path)  # resume= from elsewhere: Hydra's own new directory goes
    with pytest.raises(trainer.TrainerError, match=f"the data of {api} changed since it"):
        trainer.fit([*args, "epochs=2", f"resume={api}"])
    assert {run_dir: _every_byte(run_dir) for run_dir in (cli, api)} == before
    assert not (tmp_path / "outputs").exists()
    # on the data it trained on, the rerun continues and records its own config
    for name in ("cat", "dog"):
        for extra in (images / name).glob("extra*"):
            extra.unlink()
    assert run_main(*args, "epochs=2", f"hydra.run.dir={cli}", cwd=tmp_path).returncode == 0
    assert OmegaConf.load(cli / ".hydra" / "config.yaml").epochs == 2
    assert "- epochs=2" in (cli / ".hydra" / "overrides.yaml").read_text()
    hydra = OmegaConf.load(cli / ".hydra" / "hydra.yaml").hydra
    assert hydra.output_subdir == ".hydra" and "output_subdir" not in str(hydra.overrides.hydra)
    assert trainer.fit([*args, "epochs=2"], run_dir=api).summary["epochs_done"] == 2
    assert OmegaConf.load(api / ".hydra" / "config.yaml").epochs == 2


def test_workers_compare_a_folders_listing_without_reading_its_files(tmp_path, monkeypatch):
    """The cluster's data agreement reads an image folder's listing (paths, sizes, classes:
    `of_folder`'s `sha256`) and hashes no file, so each worker decodes only its share; the
    run's record still gets the content hash where it is asked for."""
    from trainer.data import image_folder
    from trainer.distribute.runtime import data_facts

    _folder(tmp_path / "data", per_class=6)
    monkeypatch.setenv("TRAINER_CACHE_DIR", str(tmp_path / "cache"))
    source = image_folder.load(path=str(tmp_path / "data"), image_size=8)
    hashed = []
    monkeypatch.setattr(fingerprint, "file_hash", lambda path: hashed.append(path) or "0" * 32)
    facts = data_facts(source)
    assert hashed == []
    full = source.fingerprint()
    assert len(hashed) == 12
    for role, found in full.items():
        assert facts[f"fingerprint.{role}.sha256"] == found["sha256"]
        assert facts[f"fingerprint.{role}.examples"] == found["examples"]
