"""The digits' split, kept in trainer's cache: the next run reads it without scikit-learn."""

from __future__ import annotations

import sys

import numpy as np

from trainer.data import digits


def _same(a: dict, b: dict) -> bool:
    return set(a) == set(b) == set(digits.SPLITS) and all(
        a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


def test_the_split_is_kept_and_read_again_without_scikit_learn(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINER_CACHE_DIR", str(tmp_path))
    first = digits.split(0.1, 0.1)
    assert [p.suffix for p in (tmp_path / "digits").iterdir()] == [".npz"]
    assert [len(first[k]) for k in ("y_train", "y_val", "y_test")] == [1437, 180, 180]
    assert _same(first, digits._split_by_sklearn(0.1, 0.1))
    # scikit-learn cannot be imported now: the kept split is what is read
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    monkeypatch.setitem(sys.modules, "sklearn.model_selection", None)
    assert _same(digits.split(0.1, 0.1), first)
    source = digits.load(image_size=8)
    assert source.train_size == 1437


def test_a_damaged_or_other_split_is_made_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINER_CACHE_DIR", str(tmp_path))
    first = digits.split(0.1, 0.1)
    (kept,) = (tmp_path / "digits").iterdir()
    kept.write_bytes(b"not a zip")
    assert _same(digits.split(0.1, 0.1), first)
    assert kept.read_bytes()[:2] == b"PK"  # written again
    without_test = digits.split(0.2, 0.0)
    assert len(list((tmp_path / "digits").iterdir())) == 2
    assert len(without_test["y_test"]) == 0 and len(without_test["y_val"]) == 360
