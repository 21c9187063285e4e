"""Strategy and cross-device ops: the decision table, and real strategies on logical CPUs."""

from __future__ import annotations

import pytest
import tensorflow as tf

from trainer.config.errors import ConfigError
from trainer.distribute.runtime import build_strategy
from trainer.distribute.strategy import choose_cross_device_ops, choose_strategy


@pytest.mark.parametrize("name, replicas, chosen", [
    ("auto", 1, "default"), ("auto", 2, "mirrored"), ("auto", 8, "mirrored"),
    ("mirrored", 1, "mirrored"), ("one_device", 1, "one_device"), ("default", 1, "default"),
])
def test_choose_strategy(name, replicas, chosen):
    assert choose_strategy(name, replicas) == chosen


def test_one_gpu_replica_gets_one_device_and_one_cpu_replica_the_default():
    assert choose_strategy("auto", 1, kind="gpu") == "one_device"
    assert choose_strategy("auto", 1, kind="cpu") == "default"


@pytest.mark.parametrize("name", ["one_device", "default"])
def test_single_device_strategies_refuse_several_devices(name):
    with pytest.raises(ConfigError, match=f"strategy={name} runs on one device but 2 devices"):
        choose_strategy(name, 2)


@pytest.mark.parametrize("name, kind, replicas, nccl, chosen", [
    ("auto", "gpu", 4, True, "nccl"),
    ("auto", "gpu", 4, False, "hierarchical_copy"),
    ("auto", "cpu", 4, False, "collective"),
    ("auto", "gpu", 1, True, "none"),
    ("reduction_to_one_device", "gpu", 2, True, "reduction_to_one_device"),
    ("hierarchical_copy", "cpu", 2, False, "hierarchical_copy"),
])
def test_choose_cross_device_ops(name, kind, replicas, nccl, chosen):
    assert choose_cross_device_ops(name, kind, replicas, nccl) == chosen


def test_nccl_needs_gpus():
    with pytest.raises(ConfigError, match="nccl needs several GPUs"):
        choose_cross_device_ops("nccl", "cpu", 2, False)


@pytest.mark.parametrize("replicas, physical, nccl, chosen", [
    (2, 1, True, "reduction_to_one_device"),  # two logical GPUs of one physical GPU
    (4, 2, True, "reduction_to_one_device"),  # two logical GPUs on each of two
    (2, 1, False, "reduction_to_one_device"),
    (2, 2, True, "nccl"),  # one physical GPU per replica
    (8, 8, True, "nccl"),
    (2, 2, False, "hierarchical_copy"),
    (2, None, True, "nccl"),  # not told: one per replica, as the framework's own plans give
])
def test_logical_gpus_sharing_a_physical_gpu_never_get_nccl(replicas, physical, nccl, chosen):
    assert choose_cross_device_ops("auto", "gpu", replicas, nccl, physical_gpus=physical) == chosen


def test_physical_gpus_do_not_change_the_cpu_choice():
    assert choose_cross_device_ops("auto", "cpu", 4, False, physical_gpus=0) == "collective"


def test_nccl_asked_for_on_logical_gpus_of_one_gpu_is_refused():
    with pytest.raises(ConfigError, match="needs a physical GPU per replica.*received: 2 "
                                          r"replicas on 1 physical GPU\(s\)$"):
        choose_cross_device_ops("nccl", "gpu", 2, True, physical_gpus=1)
    assert choose_cross_device_ops("nccl", "gpu", 2, True, physical_gpus=2) == "nccl"
    assert choose_cross_device_ops("hierarchical_copy", "gpu", 2, True,
                                   physical_gpus=1) == "hierarchical_copy"


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_mirrored_on_logical_cpus(replicas):
    devices = tuple(f"/cpu:{i}" for i in range(replicas))
    strategy = build_strategy("mirrored", devices, "collective")
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert strategy.num_replicas_in_sync == replicas
    assert strategy.extended.worker_devices == tuple(
        f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(replicas))


@pytest.mark.parametrize("ops, cls", [
    ("reduction_to_one_device", tf.distribute.ReductionToOneDevice),
    ("hierarchical_copy", tf.distribute.HierarchicalCopyAllReduce),
])
def test_named_cross_device_ops_are_used(ops, cls):
    strategy = build_strategy("mirrored", ("/cpu:0", "/cpu:1"), ops)
    assert isinstance(strategy.extended._cross_device_ops, cls)


def test_one_device_and_default():
    one = build_strategy("one_device", ("/cpu:2",), "none")
    assert isinstance(one, tf.distribute.OneDeviceStrategy)
    assert one.extended.worker_devices == ("/job:localhost/replica:0/task:0/device:CPU:2",)
    assert build_strategy("default", ("/cpu:0",), "none") is tf.distribute.get_strategy()


def test_strategies_in_one_process_do_not_share_collective_keys():
    """A plain MirroredStrategy built after ours must not reuse our collective keys."""
    import keras
    import numpy as np

    ours = build_strategy("mirrored", ("/cpu:0", "/cpu:1"), "collective")
    plain = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert tf.distribute.MirroredStrategy._collective_key_base == 0
    x, y = np.ones((8, 3), "float32"), np.zeros(8, "int32")
    for strategy, width in ((ours, 5), (plain, 7)):  # different shapes, same group size
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(width)])
            model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)


def test_one_record_per_strategy_kind_says_what_differs():
    from trainer.config.schema import STRATEGIES
    from trainer.distribute.strategy import KINDS

    assert set(KINDS) == set(STRATEGIES) - {"auto"}
    multi = KINDS["multi_worker"]
    assert (multi.several_workers, multi.fit_works, multi.needs_seed,
            multi.resume_from_chief, multi.evaluate_as) == (True, False, True, True, "auto")
    for name in ("default", "one_device", "mirrored"):
        kind = KINDS[name]
        assert kind.fit_works and not kind.needs_seed and kind.evaluate_as == name


def test_each_built_in_kind_is_its_record_its_builder_and_its_yaml():
    """docs/architecture.md's 3 files of a built-in kind: the record (`KINDS`), the builder
    it names (in `trainer.distribute.runtime`), and `conf/strategy/NAME.yaml` naming it;
    `strategy=auto` picks each situation's kind, one each."""
    from omegaconf import OmegaConf

    import trainer.distribute.runtime as runtime
    from trainer.config.schema import config_dir
    from trainer.config.strategies import KINDS, situation

    for name, kind in KINDS.items():
        module, _, builder = kind.build.rpartition(".")
        assert module == runtime.__name__ and callable(getattr(runtime, builder)), name
        assert OmegaConf.load(config_dir() / "strategy" / f"{name}.yaml").name == name
    situations = {situation(r, w, d) for r in (1, 2) for w in (1, 2) for d in ("cpu", "gpu")}
    assert sorted(kind.auto for kind in KINDS.values()) == sorted(situations)
