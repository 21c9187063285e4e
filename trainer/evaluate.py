"""`python -m trainer.evaluate RUN_DIR [overrides]`: evaluate a finished run's checkpoint.

Loads the run's composed config (`RUN_DIR/.hydra/config.yaml`), applies the overrides (for
example `accelerator=cpu devices=2`, or `checkpoint=last`), builds the strategy for those
devices, loads `checkpoints/best.keras` (or `last.keras`) inside its scope, and evaluates
every validation example once. Prints the metrics as JSON; exit code 2 on bad input.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from trainer.config import ConfigError, validate

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


def evaluate_run(run_dir: str | Path, overrides: list[str] = ()) -> dict[str, Any]:
    """Evaluates a run's best (or, with `checkpoint=last`, last) checkpoint.

    Args:
        run_dir: a run directory written by `python -m trainer`.
        overrides: `key=value` changes to the run's config, e.g. `devices=2`.

    Returns:
        `{"checkpoint": path, "replicas": n, "metrics": {...}}`.
    """
    run_dir = Path(run_dir)
    cfg, which = _load_config(run_dir, list(overrides))
    checkpoint = run_dir / "checkpoints" / f"{which}.keras"
    if not checkpoint.is_file():
        raise ConfigError(f"no checkpoint {checkpoint}; valid: checkpoint=best or "
                          "checkpoint=last of a finished run")
    from trainer.devices import configure_devices, memory_option, plan_devices
    from trainer.scaling import plan_batch
    from trainer.strategy import build_strategy, choose_cross_device_ops, choose_strategy
    from trainer.train import build_data, visible_gpu_count

    plan = plan_devices(cfg.accelerator, cfg.devices, visible_gpu_count(),
                        cfg.soft_placement)
    configure_devices(plan, memory_option(cfg.gpu.memory_growth, cfg.gpu.memory_limit_mb))
    replicas = len(plan.names)
    # A multi-worker run's checkpoint is evaluated on this machine's devices.
    name = "auto" if cfg.strategy.name == "multi_worker" else cfg.strategy.name
    strategy = build_strategy(choose_strategy(name, replicas), plan.names,
                              choose_cross_device_ops(cfg.strategy.cross_device_ops, plan.kind,
                                                      replicas, False))
    global_batch = plan_batch(cfg.batch.per_replica, cfg.batch.global_size, replicas).global_size
    with strategy.scope():
        data = build_data(cfg, global_batch, replicas)
        model = load_checkpoint(checkpoint)
    metrics = model.evaluate(data["validation"], return_dict=True, verbose=0)
    return {"checkpoint": str(checkpoint), "replicas": replicas,
            "metrics": {k: float(v) for k, v in metrics.items()}}


def load_checkpoint(path: str | Path):
    """Loads a `.keras` checkpoint written by trainer, with the custom objects it may hold."""
    import keras

    import trainer.models.cifar10_cnn  # noqa: F401 - registers LocalResponseNormalization
    import trainer.schedule  # noqa: F401 - registers WarmupSchedule

    return keras.models.load_model(path)


def _load_config(run_dir: Path, overrides: list[str]) -> tuple[Any, str]:
    path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no .hydra/config.yaml)")
    which = "best"
    rest = []
    for item in overrides:
        if item.startswith("checkpoint="):
            which = item.split("=", 1)[1]
        else:
            rest.append(item)
    if which not in ("best", "last"):
        raise ConfigError(f"checkpoint must be best or last; received: {which!r}")
    cfg = OmegaConf.merge(OmegaConf.load(path), OmegaConf.from_dotlist(rest))
    validate(cfg)
    return cfg, which


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("error: usage: python -m trainer.evaluate RUN_DIR [key=value ...]; received "
              "nothing", file=sys.stderr)
        return 2
    try:
        result = evaluate_run(args[0], args[1:])
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
