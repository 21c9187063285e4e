"""A finished run's config composed again, for evaluation and prediction on this machine.

The run's saved config (`RUN_DIR/.hydra/config.yaml`) is composed again by Hydra over the
schema, with the command's overrides (`accelerator=cpu devices=2`, `checkpoint=last`), so a
typo or a wrong type fails as it does for training; a multi-worker run's strategy becomes
the one that runs it on this machine's devices. A decide module: no TensorFlow.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from trainer.config.compose import compose_in
from trainer.config.errors import ConfigError
from trainer.config.overrides import split, value_of
from trainer.config.schema import register_configs
from trainer.distribute.strategy import KINDS
from trainer.run.prepare.inputs import kept as kept_inputs
from trainer.run.prepare.preflight import check_config
from trainer.run.prepare.resolve import Spec, resolve
from trainer.rundir.layout import RunDir
from trainer.rundir.resume import latest_state

CHECKPOINTS = ("best", "last", "averaged")


@dataclass(frozen=True)
class Reopened:
    """A finished run's config composed again for this machine: its `Spec`, and the
    checkpoint (`best` or `last`) to load."""

    run_dir: Path
    spec: Spec
    checkpoint: Path
    which: str
    # what its model takes (`trainer.run.prepare.inputs`); None: older run
    inputs: dict | None = None

    @property
    def images(self) -> bool:
        """Whether the run trained on an image folder (its inputs are image files)."""
        return str(self.spec.dataset["_target_"]).endswith("image_folder.load")


def reopen(run_dir: str | Path, overrides: list[str]) -> Reopened:
    """A run's saved config with the overrides, checked and resolved, and its checkpoint,
    which must exist.

    Raises:
        ConfigError: not a run, a bad override, a missing checkpoint; one line each.
    """
    run_dir = Path(run_dir)
    cfg, which = compose_run_config(run_dir, overrides)
    return Reopened(run_dir, resolve(cfg, parsed=check_config(cfg)),
                    checkpoint_of(run_dir, which), which, kept_inputs(run_dir))


def unfinished(opened: Reopened) -> str | None:
    """For a run that did not finish (no summary): where it stopped and which epoch's
    weights the checkpoint holds, as one line; None for a finished run."""
    layout = RunDir(opened.run_dir)
    if layout.finished():
        return None
    state = latest_state(opened.run_dir) or {}
    epochs, done, step = opened.spec.epochs, int(state.get("epoch", 0)), int(state.get("step", 0))
    where = ("before its first backup" if not state else
             f"in epoch {done + 1} of {epochs}, its newest backup at step {step}" if step else
             f"after epoch {done} of {epochs}")
    return (f"{opened.run_dir} did not finish (no summary.json): it stopped {where}; "
            f"predicting with {opened.checkpoint}{_holds(opened, state)}")


def _holds(opened: Reopened, state: dict) -> str:
    """`, the best val_loss (0.52) of epoch 1`: which epoch `best.keras` was written at."""
    if opened.which == "averaged":
        return ", the averaged model of its training"
    if opened.which != "best":
        return ", the weights at the end of its training"
    try:
        best = json.loads(RunDir.best_record(opened.checkpoint).read_text())
        monitor, value = best["monitor"], float(best["best"])
        epoch = list(state.get("history", {}).get(monitor, [])).index(value) + 1
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return f", the best {monitor} ({value:.4g}) of epoch {epoch}"
SPLITS = ("validation", "test")


def checkpoint_of(run_dir: Path, which: str) -> Path:
    """The run's `best`, `last` or `averaged` checkpoint, which must exist."""
    checkpoint = RunDir(run_dir).checkpoint(which)
    if not checkpoint.is_file():
        there = [name for name in CHECKPOINTS if RunDir(run_dir).checkpoint(name).is_file()]
        why = (" (the run kept no averaged model: optimizer.ema=true or "
               "checkpoint.average_best=k make one)" if which == "averaged" else "")
        valid = (f"valid: {' or '.join(f'checkpoint={n}' for n in there)}" if there
                 else "the run has written none yet")
        raise ConfigError(f"no checkpoint {checkpoint}{why}; {valid}")
    return checkpoint


def trained_on(run_dir: Path) -> dict | None:
    """The data fingerprint the run kept: its summary's, else its newest backup's."""
    try:
        return json.loads(RunDir(run_dir).summary.read_text()).get("data")
    except (OSError, ValueError, AttributeError):
        return (latest_state(run_dir) or {}).get("data")


def take_option(key: str, default: str | None,
                overrides: list[str]) -> tuple[str | None, list[str]]:
    """A `key=value` of the command's own (the last one given), and the other overrides."""
    taken = [o for o in overrides if split(o)[0] == key and value_of(o) is not None]
    return (value_of(taken[-1]) if taken else default), [o for o in overrides
                                                         if o not in taken]


def take_choice(key: str, valid: tuple[str, ...], overrides: list[str]) -> tuple[str, list[str]]:
    """Evaluation's own `key=value` (the first of `valid` by default), and the rest."""
    value, rest = take_option(key, valid[0], overrides)
    if value not in valid:
        raise ConfigError(f"{key} must be {' or '.join(valid)}; received: {value!r}")
    return value, rest


def compose_run_config(run_dir: Path, overrides: list[str]) -> tuple[DictConfig, str]:
    """The run's saved config, composed again by Hydra over the schema with `overrides`
    (checked by the caller: `reopen`).

    Returns:
        The config and which checkpoint (`best` or `last`) to load.
    """
    saved = RunDir(run_dir).config
    if not saved.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no .hydra/config.yaml)")
    which, rest = take_choice("checkpoint", CHECKPOINTS, overrides)
    register_configs()
    try:
        primary = OmegaConf.load(saved)
    except Exception as error:  # noqa: BLE001 - yaml's and OmegaConf's errors alike
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(f"{saved} is not a readable config ({first}); it was written by "
                          "Hydra when the run started: restore it, or evaluate another run"
                          ) from None
    if not isinstance(primary, DictConfig) or "dataset" not in primary:
        raise ConfigError(f"{saved} is not a run's config (no dataset in it); restore it, or "
                          "evaluate another run")
    primary.defaults = ["config_schema", "_self_"]
    # Evaluation runs on this machine's devices, not a cluster's.
    name = primary.strategy.name
    primary.strategy.name = KINDS[name].evaluate_as if name in KINDS else name
    primary.cluster = {"workers": [], "task_index": 0}
    # Evaluation logs nothing (a tracker's package need not be here), and rebuilds the model
    # only to load the checkpoint into it (no ImageNet download, no earlier weights file).
    primary.pop("tensorboard", None)  # runs from before the logger group
    primary.logger = {}
    # Nor callbacks, a sweep's metric or a profile: their values may read Hydra's job
    # (`${hydra:...}`), which evaluation does not run in.
    primary.callbacks = {}
    primary.optimized_metric = None
    primary.profile = None
    if "weights" in primary.model:
        primary.model.weights = None
    _same_split_as_trained(primary, run_dir)
    with tempfile.TemporaryDirectory(prefix="trainer-evaluate-") as folder:
        OmegaConf.save(primary, Path(folder) / "run.yaml")
        cfg = compose_in(folder, "run", rest)
    return cfg, which


def _same_split_as_trained(primary: DictConfig, run_dir: Path) -> None:
    """Keeps the data split a run made before test splits existed trained on."""
    dataset = primary.dataset
    if "test_fraction" in dataset or "_target_" not in dataset:
        return
    if str(dataset._target_).endswith("digits.load"):
        dataset.test_fraction = 0  # the held-out share was all validation: the same split
    elif str(dataset._target_).endswith("image_folder.load"):
        raise ConfigError(f"{run_dir} was trained before image_folder's own split (Keras's "
                          "loader chose its validation files); its validation files cannot be "
                          "listed again, so it cannot be evaluated without the risk of "
                          "scoring training images")
