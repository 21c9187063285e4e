"""The checks of a config that run before TensorFlow starts, gathered in one place.

The config's own checks (`trainer.config.validate`) and those owned by one part of a run (a
tracker's package and server, an augmentation preset, fine-tuning options) are run here
together; the command line and `train()` call `check_config` once per run.
"""

from __future__ import annotations

from omegaconf import DictConfig

from trainer.config.validate import validate
from trainer.data.augment import check as check_augment
from trainer.task.finetune import check as check_finetune
from trainer.track.loggers import check_loggers


def check_config(cfg: DictConfig) -> None:
    """Checks every value of a composed config before anything is built or written.

    Args:
        cfg: the composed config.

    Raises:
        ConfigError: naming the bad value and what would be valid.
    """
    validate(cfg)
    check_loggers(cfg.logger)
    check_augment(cfg.augment)
    check_finetune(cfg.finetune, str(cfg.optimizer.get("_target_", "")))
