"""`curves.png`: drawn from the run's per-epoch history, at each epoch's end and at the end,
one point per epoch, the best checkpoint's epoch marked; a killed run and a resumed one too."""

from __future__ import annotations

import json
import math

import pytest
from PIL import Image

from tests.test_resume import SigtermAt
from trainer.config.errors import Interrupted
from trainer.run.train import train
from trainer.rundir.backup import tidy
from trainer.track.curves import Curves, best_epoch, draw_curves, panels, read_curves

HISTORY = {"loss": [2.0, 1.0, 0.5], "accuracy": [0.2, 0.6, 0.8], "val_loss": [1.5, 0.9, 1.1],
           "val_accuracy": [0.5, 0.7, 0.7], "learning_rate": [0.1, 0.1, 0.1]}


def test_the_best_epoch_is_the_first_with_the_best_value_as_a_checkpoint_keeps_it():
    assert best_epoch(HISTORY, "val_accuracy", "max") == 2  # epoch 3 ties: no improvement
    assert best_epoch(HISTORY, "val_loss", "min") == 2
    assert best_epoch(HISTORY, "loss", "min") == 3
    assert best_epoch({"val_loss": [math.nan, 2.0, 1.0]}, "val_loss", "min") == 3
    assert best_epoch(HISTORY, "val_auc", "max") is None  # not logged
    assert best_epoch(HISTORY, None, None) is None  # no best checkpoint kept


def test_one_panel_per_quantity_loss_first_learning_rate_left_out():
    assert panels({"accuracy": [1], "loss": [1], "val_accuracy": [1], "val_loss": [1],
                   "learning_rate": [1], "val_mae": [1]}) == ["loss", "accuracy", "mae"]


def test_the_picture_keeps_what_it_was_drawn_from(tmp_path):
    path = tmp_path / "curves.png"
    drawn = draw_curves(HISTORY, path, best_epoch=2, monitor="val_accuracy")
    assert drawn == read_curves(path)
    assert drawn["best_epoch"] == 2 and drawn["monitor"] == "val_accuracy"
    assert drawn["history"] == {k: v for k, v in HISTORY.items() if k != "learning_rate"}
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size[0] > 600  # two panels side by side
    assert [p.name for p in tmp_path.iterdir()] == ["curves.png"]  # no temporary left
    draw_curves({}, path)  # before any epoch: a picture that says so, not an error
    assert read_curves(path)["history"] == {}


def test_a_half_written_picture_is_tidied_away(tmp_path):
    (tmp_path / ".curves.png.tmp").write_bytes(b"\x89PNG")
    tidy(tmp_path)
    assert not (tmp_path / ".curves.png.tmp").exists()


def test_drawing_takes_a_bounded_share_of_the_run(tmp_path):
    history = {"loss": [1.0]}
    every = Curves(tmp_path, lambda: history, "loss", "min", spacing=0)
    spaced = Curves(tmp_path / "spaced", lambda: history, "loss", "min", spacing=1e6)
    for epoch in range(3):
        history["loss"] = [1.0 / (n + 1) for n in range(epoch + 1)]
        every.on_epoch_end(epoch)
        spaced.on_epoch_end(epoch)
    assert every.drawings == 3 and len(read_curves(every.path)["history"]["loss"]) == 3
    assert spaced.drawings == 1  # the next epochs came before the drawing's share allowed
    assert spaced.draw(history) is not None and spaced.drawings == 2  # the run's end
    assert spaced.draw(history) is None  # drawn already: not again
    assert read_curves(spaced.path)["best_epoch"] == 3


def test_a_runs_first_seconds_draw_at_no_epochs_end(tmp_path):
    history = {"loss": [1.0]}
    young = Curves(tmp_path, lambda: history, "loss", "min", spacing=0, first=1e6)
    young.on_train_begin()
    for epoch in range(3):
        young.on_epoch_end(epoch)
    assert young.drawings == 0 and not young.path.exists()
    assert young.draw(history) is not None and young.drawings == 1  # the run's end, or a stop


def _points(run_dir, history):
    drawn = read_curves(run_dir / "curves.png")
    assert set(drawn["history"]) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert drawn["history"] == {k: history[k] for k in drawn["history"]}
    return drawn


def test_a_killed_run_and_its_resume_have_curves_one_point_per_epoch(tiny_config, tmp_path,
                                                                      monkeypatch):
    # No epoch's end draws (the run is younger than Curves.FIRST): the stop draws its
    # backup's epochs, and the resumed run's end the rest.
    monkeypatch.setattr(Curves, "SPACING", 1e9)
    config = ("accelerator=cpu", "devices=1", "epochs=3")
    with pytest.raises(Interrupted):  # stopped in epoch 2: epoch 1 drawn at the stop
        train(tiny_config(*config), run_dir=tmp_path, callbacks=[SigtermAt(1, 3)])
    state = json.loads(next((tmp_path / "backup").glob("ckpt-*/state.json")).read_text())
    drawn = _points(tmp_path, state["history"])
    assert [len(v) for v in drawn["history"].values()] == [1, 1, 1, 1]

    summary = train(tiny_config(*config, f"resume={tmp_path}"))
    drawn = _points(tmp_path, summary["history"])
    assert [len(v) for v in drawn["history"].values()] == [3, 3, 3, 3]
    kept = json.loads((tmp_path / "checkpoints" / "best.keras.best.json").read_text())
    assert drawn["monitor"] == "val_accuracy"
    assert drawn["history"]["val_accuracy"][drawn["best_epoch"] - 1] == pytest.approx(
        kept["best"])
