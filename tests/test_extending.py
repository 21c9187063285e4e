"""Where new code goes (docs/architecture.md), held to its word: a tracker and a strategy
kind of a project's own take the files the page says, and a run uses them."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"

TRACKER = {
    "fake_tracker.py": '''
import json

import keras


class Rows(keras.callbacks.Callback):
    def __init__(self, path):
        super().__init__()
        self.path = path

    def on_epoch_end(self, epoch, logs=None):
        with open(self.path, "a") as f:
            f.write(json.dumps({"epoch": epoch, "loss": float(logs["loss"])}) + "\\n")

    def logged_at(self, run_dir):
        return "fake", str(self.path)


def build(run_dir, params, chief, name="rows.jsonl"):
    return Rows(run_dir / name) if chief else None
''',
    "conf/logger/fake.yaml": "fake:\n  _target_: fake_tracker.build\n  name: rows.jsonl\n",
}

STRATEGY_KIND = {
    "fake_strategy.py": '''
from trainer.distribute.strategy import StrategyKind

FAKE = StrategyKind("fake", build="fake_strategy.build", one_device=True)
BUILT = []


def build(devices, **_):
    import tensorflow as tf

    BUILT.append(devices)
    return tf.distribute.OneDeviceStrategy(devices[0])
''',
    "conf/strategy/fake.yaml": "name: fake_strategy.FAKE\ncross_device_ops: auto\n",
}


def _files_said(what: str) -> int:
    """The number of files docs/architecture.md says `what` takes (`**A tracker** (2 files)`)."""
    found = re.search(rf"\*\*{what}\*\* \((\d+) files?", DOCS.read_text())
    assert found, what
    return int(found.group(1))


def test_a_tracker_and_a_strategy_kind_of_ones_own_take_the_files_the_docs_say(
        tmp_path, monkeypatch):
    import trainer

    project = tmp_path / "project"
    for files in (TRACKER, STRATEGY_KIND):
        for name, text in files.items():
            (project / name).parent.mkdir(parents=True, exist_ok=True)
            (project / name).write_text(text.lstrip())
    assert len(TRACKER) == _files_said("A tracker")
    assert len(STRATEGY_KIND) == _files_said("A strategy kind")
    monkeypatch.syspath_prepend(str(project))
    run_dir = tmp_path / "run"
    result = trainer.fit(["epochs=1", "verbose=0", "dataset.image_size=8", "model=small",
                          "accelerator=cpu", "devices=1", "strategy=fake", "logger=[fake]"],
                         config_dir=project / "conf", run_dir=run_dir)
    assert sys.modules["fake_strategy"].BUILT == [("/cpu:0",)]
    assert result.summary["strategy"] == "fake_strategy.FAKE"
    rows = [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [0]
    assert result.summary["loggers"]["fake"] == str(run_dir / "rows.jsonl")


def test_a_strategy_kind_of_ones_own_is_one_line_where_it_names_none():
    """A dotted name whose module is nowhere is refused by the config's check, before
    anything starts; one naming something else than a `StrategyKind` once the run looks it
    up (its module imported then, TensorFlow running)."""
    import pytest

    from tests.conftest import make_config
    from trainer.config.errors import ConfigError
    from trainer.config.validate import validate
    from trainer.distribute.strategy import choose_strategy

    with pytest.raises(ConfigError) as refused:
        validate(make_config("strategy.name=no_such_module.TPU"))
    assert str(refused.value) == ("strategy.name='no_such_module.TPU': no module named "
                                  "'no_such_module' (is it installed, or in the working "
                                  "directory?)")
    with pytest.raises(ConfigError) as refused:
        choose_strategy("json.dumps", 1)
    assert str(refused.value) == ("strategy.name='json.dumps' names no strategy kind; valid: "
                                  "auto, mirrored, one_device, multi_worker, default, or the "
                                  "dotted name of a StrategyKind record of your own")
