"""The checks of a config that run before TensorFlow starts, gathered in one place.

The config's own checks (`trainer.config.validate`) and those owned by one part of a run (a
tracker's package and server, an augmentation preset, fine-tuning options, an export
format's converter) are run here together. The command line checks before Hydra writes
anything and `train()` checks again for API users; a config already checked in this
process is not checked twice, and a tracker's server is probed once.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from trainer.config.validate import export_formats, validate
from trainer.data.augment import check as check_augment
from trainer.models.export import check_converters
from trainer.task.finetune import check as check_finetune
from trainer.track.loggers import check_loggers

# The configs (as YAML, interpolations unresolved) that passed, and that passed with their
# servers reached, in this process.
_passed: set[str] = set()
_reached: set[str] = set()


def check_config(cfg: DictConfig, reach: bool = False) -> None:
    """Checks every value of a composed config before anything is built or written.

    Args:
        cfg: the composed config (without Hydra's own `hydra` node).
        reach: also connect to the servers the config names (an MLflow tracking server).

    Raises:
        ConfigError: naming the bad value and what would be valid.
    """
    key = OmegaConf.to_yaml(cfg, resolve=False)
    if key not in _passed:
        validate(cfg)
        check_loggers(cfg.logger)
        check_augment(cfg.augment)
        check_finetune(cfg.finetune, str(cfg.optimizer.get("_target_", "")))
        check_converters(export_formats(cfg.export))
        _passed.add(key)
    if reach and key not in _reached:
        check_loggers(cfg.logger, reach=True)
        _reached.add(key)
