"""The kinds of tf.distribute strategy a run can name (`strategy.name`), one record each.

A kind's `StrategyKind` record holds all that differs between kinds: when `strategy=auto`
picks it, which devices and cluster it refuses, how it trains and resumes, and its builder,
named by its dotted name and imported only when the strategy is created
(`trainer.distribute.runtime.build_strategy`, TensorFlow running by then). So the records
are read before TensorFlow starts (the config's check knows their names), and a new kind is
its record, its builder and its `conf/strategy/NAME.yaml`.

A kind of your own is a record in a module of yours, named by its dotted name
(`strategy.name=my_project.strategies.TPU`, or a `conf/strategy/tpu.yaml` saying so); its
module is imported once TensorFlow runs, so it may build the strategy itself.

Which strategy a run gets is decided in `trainer.distribute.strategy` (`choose_strategy`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from trainer.config.errors import ConfigError

# What `strategy=auto` looks at: the situation of a run's devices and cluster.
SEVERAL_WORKERS = "several workers"
ONE_CPU_REPLICA = "one CPU replica"
ONE_GPU_REPLICA = "one GPU replica"
SEVERAL_REPLICAS = "several replicas on one machine"


def situation(replicas: int, workers: int, device: str) -> str:
    """The situation `strategy=auto` picks a kind for.

    Args:
        replicas: the devices chosen on this machine.
        workers: the workers in the cluster (1 without one).
        device: `gpu` or `cpu`.
    """
    if workers > 1:
        return SEVERAL_WORKERS
    if replicas == 1:
        return ONE_CPU_REPLICA if device == "cpu" else ONE_GPU_REPLICA
    return SEVERAL_REPLICAS


@dataclass(frozen=True)
class StrategyKind:
    """What differs between the kinds of strategy, in one record per kind.

    Attributes:
        name: the config's name for it.
        build: the dotted name of its builder, `f(devices, cross_device_ops, cluster,
            communication) -> tf.distribute.Strategy` (called with keywords: the device
            names, the resolved cross-device ops, the multi-worker cluster or None, and
            `strategy.communication`), imported when the strategy is created.
        auto: the situation (`situation`) in which `strategy=auto` picks it; None: never.
        several_workers: it spans worker processes (a cluster); one machine otherwise.
        one_device: it runs on one device, and refuses several.
        one_cpu_replica: it runs one replica per CPU worker, and refuses several CPUs.
        fit_works: Keras 3.15's `fit` trains under it (under MultiWorkerMirroredStrategy it
            fails: keras-team/keras#20585; the custom loop runs instead).
        needs_seed: every worker must shuffle alike, so a run needs a seed.
        resume_from_chief: only the chief keeps backups; every worker continues from its.
        evaluate_as: the kind evaluation uses on one machine.
    """

    name: str
    build: str
    auto: str | None = None
    several_workers: bool = False
    one_device: bool = False
    one_cpu_replica: bool = False
    fit_works: bool = True
    needs_seed: bool = False
    resume_from_chief: bool = False
    evaluate_as: str = "auto"

    def check(self, replicas: int, workers: int, device: str) -> None:
        """Refuses devices and a cluster this kind cannot run on.

        Args:
            replicas: the devices chosen on this machine.
            workers: the workers in the cluster (1 without one).
            device: `gpu` or `cpu`.

        Raises:
            ConfigError: naming the kind, what was chosen and what would run.
        """
        if workers > 1 and not self.several_workers:
            raise ConfigError(f"strategy={self.name} runs on one machine but the cluster has "
                              f"{workers} workers; use strategy=multi_worker (or auto)")
        if self.one_cpu_replica and device == "cpu" and replicas > 1:
            raise ConfigError(f"strategy={self.name} runs one replica per CPU worker, but "
                              f"{replicas} CPU devices were chosen; use devices=auto (or 1), "
                              "and one worker per replica (python -m trainer.launch "
                              "--workers N)")
        if self.one_device and replicas > 1:
            raise ConfigError(f"strategy={self.name} runs on one device but {replicas} devices "
                              "were chosen; use strategy=mirrored (or auto), or devices=1")


RUNTIME = "trainer.distribute.runtime"

# The built-in kinds, in the order the config's check lists them.
KINDS = {kind.name: kind for kind in (
    StrategyKind("mirrored", f"{RUNTIME}.build_mirrored", auto=SEVERAL_REPLICAS,
                 evaluate_as="mirrored"),
    StrategyKind("one_device", f"{RUNTIME}.build_one_device", auto=ONE_GPU_REPLICA,
                 one_device=True, evaluate_as="one_device"),
    StrategyKind("multi_worker", f"{RUNTIME}.build_multi_worker", auto=SEVERAL_WORKERS,
                 several_workers=True, one_cpu_replica=True, fit_works=False,
                 needs_seed=True, resume_from_chief=True),
    # One CPU replica: Keras's default strategy. OneDeviceStrategy copies every batch "to the
    # device" (the host, again): measured on the default run, 380,000 page faults and 1.3 s
    # of system time per epoch, the epoch twice as long.
    StrategyKind("default", f"{RUNTIME}.build_default", auto=ONE_CPU_REPLICA, one_device=True,
                 evaluate_as="default"),
)}


def is_own(name: Any) -> bool:
    """Whether `strategy.name` names a kind of the user's own (a record's dotted name)."""
    return isinstance(name, str) and "." in name


def strategy_kind(name: str) -> StrategyKind:
    """The record of a strategy kind: a built-in one by its name, one of your own by its
    dotted name (its module imported here).

    Raises:
        ConfigError: the name names no kind.
    """
    if name in KINDS:
        return KINDS[name]
    found = located(name, "strategy.name") if is_own(name) else None
    if not isinstance(found, StrategyKind):
        raise ConfigError(f"strategy.name={name!r} names no strategy kind; valid: auto, "
                          f"{', '.join(KINDS)}, or the dotted name of a StrategyKind record "
                          "of your own")
    return found


def located(dotted: str, key: str) -> Any:
    """What a dotted name (`package.module.NAME`) names, its module imported.

    Raises:
        ConfigError: no such module or name, as one line naming `key`.
    """
    module, _, attribute = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigError(f"{key}={dotted!r}: cannot import it ({error}); is its module "
                          "installed, or in the working directory?") from None
