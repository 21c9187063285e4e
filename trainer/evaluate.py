"""`python -m trainer.evaluate RUN_DIR [overrides]`: evaluate a finished run's checkpoint.

The run's saved config (`RUN_DIR/.hydra/config.yaml`) is composed again by Hydra over the
schema, with the overrides (for example `accelerator=cpu devices=2`, `checkpoint=last`, or
`split=test`), so a typo or a wrong type fails as it does for training. The run is then
assembled as training assembles it (strategy for those devices, data, model, loss, metrics,
loop), `checkpoints/best.keras` (or `last.keras`) is loaded into it, and every example of
the validation split (or, with `split=test`, the test split) is evaluated once. Prints the
metrics as JSON; exit code 2 on bad input.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer.config.compose import compose_in
from trainer.config.errors import ConfigError
from trainer.config.messages import one_line
from trainer.config.outcome import one_error
from trainer.config.schema import register_configs
from trainer.data.fingerprint import check_same_data, of_source
from trainer.distribute.devices import configure_devices, memory_option, plan_devices
from trainer.distribute.strategy import KINDS
from trainer.run.assemble import assemble
from trainer.run.preflight import check_config
from trainer.run.quiet import tensorflow_started
from trainer.run.resolve import resolve
from trainer.rundir.checkpoint import verified
from trainer.rundir.layout import RunDir
from trainer.rundir.resume import latest_state

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if os.environ.get("TRAINER_TF_LOGS") == "1"
                      else "2")
CHECKPOINTS = ("best", "last")
SPLITS = ("validation", "test")


def evaluate_run(run_dir: str | Path, overrides: list[str] = ()) -> dict[str, Any]:
    """Evaluates a run's best (or, with `checkpoint=last`, last) checkpoint.

    Args:
        run_dir: a run directory written by `python -m trainer`.
        overrides: `key=value` changes to the run's config, e.g. `devices=2`.

    Returns:
        `{"checkpoint": path, "replicas": n, "metrics": {...}}`.
    """
    run_dir = Path(run_dir)
    split, rest = _take("split", SPLITS, list(overrides))
    cfg, which = compose_run_config(run_dir, rest)
    checkpoint = checkpoint_of(run_dir, which)
    run = assemble_on_these_devices(resolve(cfg))
    check_same_data(run_dir, _trained_on(run_dir), of_source(run.data.source))
    data = run.data.validation if split == "validation" else run.data.test
    if data is None:
        raise ConfigError(f"the dataset of {run_dir} has no test split; valid: "
                          "split=validation")
    load_weights_checked(run.model, checkpoint, which)
    # lazy: it imports TensorFlow, which starts after the devices are set
    from trainer.run.train import evaluate_split

    metrics = evaluate_split(run, data)
    examples = (run.data.source.validation_size if split == "validation"
                else run.data.source.test_size)
    return {"checkpoint": str(checkpoint), "split": split, "examples": examples,
            "replicas": run.strategy.num_replicas_in_sync,
            "metrics": {k: float(v) for k, v in metrics.items()}}



def checkpoint_of(run_dir: Path, which: str) -> Path:
    """The run's `best` or `last` checkpoint, which must exist."""
    checkpoint = RunDir(run_dir).checkpoint(which)
    if not checkpoint.is_file():
        raise ConfigError(f"no checkpoint {checkpoint}; valid: checkpoint=best or "
                          "checkpoint=last of a finished run")
    return checkpoint


def assemble_on_these_devices(spec: Any) -> Any:
    """A finished run's strategy, data and model, built as training built them, on the
    devices `spec` asks of this machine (evaluation and prediction)."""
    # lazy: it imports TensorFlow, which starts after the devices are set
    from trainer.run.train import visible_gpu_count

    asked = spec.devices
    plan = plan_devices(asked.accelerator, asked.devices, visible_gpu_count(),
                        asked.soft_placement)
    configure_devices(plan, memory_option(asked.memory_growth, asked.memory_limit_mb),
                      asked.soft_placement)
    return assemble(spec, plan)


def _trained_on(run_dir: Path) -> dict | None:
    """The data fingerprint the run kept: its summary's, else its newest backup's."""
    try:
        return json.loads(RunDir(run_dir).summary.read_text()).get("data")
    except (OSError, ValueError, AttributeError):
        return (latest_state(run_dir) or {}).get("data")


def load_weights_checked(model: Any, checkpoint: Path, which: str) -> None:
    """Loads a checkpoint checked against its hash; damage is one line naming the file and
    the other checkpoint to use."""
    import warnings

    other = "last" if which == "best" else "best"
    verified(checkpoint)
    try:
        with warnings.catch_warnings():
            # the optimizer's state is in the file; evaluation does not need it
            warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
            model.load_weights(checkpoint)
    except Exception as error:  # noqa: BLE001 - a damaged file fails in many ways
        raise ConfigError(f"{checkpoint} does not load ({one_line(error)}); use "
                          f"checkpoint={other}, or retrain") from None


def load_checkpoint(path: str | Path) -> Any:
    """`trainer.models.checkpoint.load_checkpoint`, imported on first use (it imports Keras,
    which must not start before this module has quieted TensorFlow)."""
    # lazy: it imports TensorFlow, which starts after the devices are set
    from trainer.models.checkpoint import load_checkpoint as load

    return load(path)


def take_option(key: str, default: str | None,
                overrides: list[str]) -> tuple[str | None, list[str]]:
    """A `key=value` of the command's own (the last one given), and the other overrides."""
    value, rest = default, []
    for item in overrides:
        if item.startswith(f"{key}="):
            value = item.split("=", 1)[1]
        else:
            rest.append(item)
    return value, rest


def _take(key: str, valid: tuple[str, ...], overrides: list[str]) -> tuple[str, list[str]]:
    """Evaluation's own `key=value` (the first of `valid` by default), and the rest."""
    value, rest = valid[0], []
    for item in overrides:
        if item.startswith(f"{key}="):
            value = item.split("=", 1)[1]
        else:
            rest.append(item)
    if value not in valid:
        raise ConfigError(f"{key} must be {' or '.join(valid)}; received: {value!r}")
    return value, rest


def compose_run_config(run_dir: Path, overrides: list[str]) -> tuple[DictConfig, str]:
    """The run's saved config, composed again by Hydra over the schema with `overrides`.

    Returns:
        The config and which checkpoint (`best` or `last`) to load.
    """
    saved = RunDir(run_dir).config
    if not saved.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no .hydra/config.yaml)")
    which, rest = _take("checkpoint", CHECKPOINTS, overrides)
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
        cfg = compose_in(folder, "run", rest)  # a user's own Hydra app keeps its state
    check_config(cfg)
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


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("error: usage: python -m trainer.evaluate RUN_DIR [key=value ...]; received "
              "nothing", file=sys.stderr)
        return 2
    sys.path.insert(0, os.getcwd())  # the user's own modules, as for training
    try:
        tensorflow_started()
        result = evaluate_run(args[0], args[1:])
    except (ConfigError, HydraException, OmegaConfBaseException) as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0



class _Callable(types.ModuleType):
    """`trainer.evaluate(...)`: the module, callable as the Python API's evaluation."""

    def __call__(self, run_dir: str | Path, overrides: list[str] = ()) -> dict[str, Any]:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        with one_error():
            tensorflow_started()
            return evaluate_run(run_dir, list(overrides))


sys.modules[__name__].__class__ = _Callable


if __name__ == "__main__":
    raise SystemExit(main())
