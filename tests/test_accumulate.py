"""Gradient accumulation: any split of one global batch into replicas x micro-batches trains alike.

Plain SGD on fixed data and initial weights at a global batch of 128: 1 replica accumulating
4 micro-batches, 2 accumulating 2 and 4 accumulating none must end with the same weights and
loss, with `fit` and the custom loop. Gradients averaged once too often (the classic
accumulation bug) fail the same check; and the step all-reduces once, whatever N.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import trainer.run.assembly.accumulate as accumulate_module
from tests.test_loop import INITIAL, assert_same, build, make_data, strategy_for
from trainer.run.assembly.accumulate import accumulating_train_step
from trainer.run.assembly.step import exact_train_step
from trainer.run.fit.loop import CustomLoop

GLOBAL = 128
# 2 full steps and a last one of 40: 10 examples on every micro-batch of every split
EVEN = 2 * GLOBAL + 40
# a last step of 43: 11, 11, 11, 10 over 4 replicas; 22, 21 cut into 11+11, 10+11 on 2
UNEVEN = 2 * GLOBAL + 43
SPLITS = [(1, 4), (2, 2), (4, 1)]


def train_split(loop: str, kind: str, replicas: int, accumulate: int, examples: int = EVEN,
                epochs: int = 2):
    """Both loops run the micro-batch step (Keras's own step where `accumulate` is 1)."""
    strategy = strategy_for(replicas)
    model = build(kind, strategy)
    if accumulate > 1:
        model.train_step = accumulating_train_step(model, accumulate)
    x, y = make_data(examples)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL)
    if loop == "fit":
        history = model.fit(data, epochs=epochs, verbose=0, shuffle=False)
    else:
        steps = -(-examples // GLOBAL)
        history = CustomLoop(model, strategy, steps_per_execution=2).fit(
            data.repeat(epochs), epochs=epochs, steps_per_epoch=steps, verbose=0)
    return model.get_weights(), history.history["loss"]


@pytest.mark.parametrize("loop", ["fit", "custom"])
@pytest.mark.parametrize("kind", ["plain", "l2"])
def test_replicas_times_micro_batches_trains_like_one_big_batch(loop, kind):
    reference = train_split(loop, kind, 4, 1)
    assert not np.allclose(reference[0][0], INITIAL[kind][0])  # it did train
    for replicas, accumulate in SPLITS[:2]:
        assert_same(reference, train_split(loop, kind, replicas, accumulate))


def test_uneven_micro_batches_are_weighted_by_the_global_count():
    """43 examples in the last step: 4 replicas' shares are uneven; with trainer's step on
    both sides every split agrees."""
    def exact(loop, replicas, accumulate):
        strategy = strategy_for(replicas)
        model = build("plain", strategy)
        model.train_step = (accumulating_train_step(model, accumulate) if accumulate > 1
                            else exact_train_step(model))
        x, y = make_data(UNEVEN)
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL).repeat(2)
        history = CustomLoop(model, strategy).fit(data, epochs=2, steps_per_epoch=3,
                                                  verbose=0)
        return model.get_weights(), history.history["loss"]

    reference = exact("custom", 4, 1)
    for replicas, accumulate in SPLITS[:2]:
        assert_same(reference, exact("custom", replicas, accumulate))


def test_a_last_batch_smaller_than_the_micro_batches_skips_the_empty_ones():
    """A last step of 3 examples cut 4 ways: one micro-batch is empty and must not train."""
    examples = GLOBAL + 3
    reference = train_split("custom", "plain", 1, 1, examples=examples)
    assert_same(reference, train_split("custom", "plain", 1, 4, examples=examples))
    assert_same(train_split("fit", "plain", 1, 1, examples=examples),
                train_split("fit", "plain", 1, 4, examples=examples))


def test_negative_control_gradients_averaged_again_are_detected(monkeypatch):
    """The classic bug: each micro-batch's mean loss, and the summed gradients averaged
    again."""
    reference = train_split("custom", "plain", 4, 1)
    right = train_split("custom", "plain", 1, 4)
    summed = accumulate_module.accumulate
    monkeypatch.setattr(accumulate_module, "accumulate", lambda n, *args: [
        None if g is None else g / n for g in summed(n, *args)])
    with pytest.raises(AssertionError):
        assert_same(reference, train_split("custom", "plain", 1, 4))
    assert_same(reference, right)


def _functions(graph_def) -> dict:
    return {f.signature.name: f for f in graph_def.library.function}


def _collectives(nodes, functions, seen=frozenset(), in_loop=False) -> list[bool]:
    """One entry per all-reduce op reachable from `nodes`: whether it runs inside a loop."""
    found = []
    for node in nodes:
        if node.op.startswith("CollectiveReduce") or node.op == "NcclAllReduce":
            found.append(in_loop)
        loop = in_loop or node.op in ("While", "StatelessWhile")
        for attr in node.attr.values():
            names = [attr.func.name] if attr.HasField("func") else [
                f.name for f in attr.list.func]
            for name in names:
                if name in functions and name not in seen:
                    found += _collectives(functions[name].node_def, functions, seen | {name},
                                          loop)
    return found


def _step_collectives(loop: str, accumulate: int, step=None) -> list[bool]:
    """The all-reduce ops of one traced training step on 2 replicas (`step(model, n)`
    makes the step where given)."""
    strategy = strategy_for(2)
    model = build("plain", strategy)
    x, y = make_data(GLOBAL)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL)
    model.train_step = (step(model, accumulate) if step is not None
                        else accumulating_train_step(model, accumulate) if accumulate > 1
                        else exact_train_step(model))
    if loop == "fit":
        model.fit(data, epochs=1, verbose=0, shuffle=False)
        function = model.train_function
        traced = [f for f in (getattr(function, "_list_all_concrete_functions", lambda: [])()
                              or ())]
        if not traced:  # Keras wraps the tf.function; find it in the closure
            inner = [c.cell_contents for c in function.__closure__ or ()
                     if hasattr(c.cell_contents, "_list_all_concrete_functions")]
            traced = inner[0]._list_all_concrete_functions()
    else:
        custom = CustomLoop(model, strategy)
        custom.fit(data, epochs=1, steps_per_epoch=1, verbose=0)
        traced = custom._train_chunk._list_all_concrete_functions()
    graph_def = traced[0].graph.as_graph_def()
    return _collectives(graph_def.node, _functions(graph_def))


def apply_per_micro_batch(model, n):
    """Naive accumulation: an optimizer step, with its all-reduce, per micro-batch.

    (A synchronisation inside a graph loop is refused by tf.distribute, so a naive version
    has to unroll the micro-batches, and each brings its own all-reduce.)
    """
    def train_step(data):
        x, y = data
        size = GLOBAL // 2 // n
        for i in range(n):
            part = slice(i * size, (i + 1) * size)
            with tf.GradientTape() as tape:
                loss = model.compute_loss(x[part], y[part], model(x[part], training=True))
            variables = model.trainable_variables
            gradients = tape.gradient(loss, variables)
            model.optimizer.apply_gradients(zip(gradients, variables, strict=True))
        return {}

    return train_step


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_one_gradient_all_reduce_per_step_whatever_the_accumulation(loop):
    once = _step_collectives(loop, 1)
    assert once and not any(once)
    for accumulate in (2, 4):
        ops = _step_collectives(loop, accumulate)
        assert len(ops) == len(once) and not any(ops), (accumulate, ops)


def test_negative_control_an_all_reduce_per_micro_batch_is_detected():
    once = _step_collectives("custom", 1)
    assert len(_step_collectives("custom", 4, step=apply_per_micro_batch)) > len(once)


# One epoch: half of it warm-up, then the cosine decay, both counted in optimizer steps.
# No best checkpoint: the test split is then evaluated with the last weights, as compared.
CONFIG = ["optimizer=sgd_momentum_cosine", "optimizer.lr=0.05", "optimizer.warmup_epochs=0.5",
          "model.dropout=0.0", "deterministic=true", "checkpoint.save_best=false",
          "batch.per_replica=null", "batch.global_size=128", "accelerator=cpu", "epochs=1"]


@pytest.mark.long
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_configured_run_on_any_split_ends_with_the_same_weights(tiny_config, tmp_path, loop):
    """Through the whole wiring: data order, the schedule and the summary use the global batch."""
    from trainer.evaluate import load_checkpoint
    from trainer.run.train import train

    # Both loops weight the uneven last batch (1437 = 11 x 128 + 29) by the global count.
    results = {}
    for replicas, accumulate in SPLITS:
        run_dir = tmp_path / f"{replicas}x{accumulate}"
        summary = train(tiny_config(*CONFIG, f"loop={loop}", f"devices={replicas}",
                                    f"batch.accumulate={accumulate}"), run_dir=run_dir)
        assert summary["batch"] == {"per_replica": 32, "replicas": replicas,
                                    "accumulate": accumulate, "global": 128,
                                    "max_per_replica": None, "drop_remainder": False}
        steps = 12  # 1437 training digits / 128, the last batch of 29
        assert summary["steps_per_epoch"] == steps
        model = load_checkpoint(run_dir / "checkpoints" / "last.keras")
        assert int(model.optimizer.iterations) == steps  # optimizer steps, not micro-batches
        results[(replicas, accumulate)] = model.get_weights(), summary
    reference, first = results[(4, 1)]
    for split in SPLITS[:2]:
        weights, summary = results[split]
        for a, b in zip(reference, weights, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
        assert summary["learning_rate"] == first["learning_rate"]
        assert summary["validation_metrics"]["loss"] == pytest.approx(
            first["validation_metrics"]["loss"], rel=1e-5)


@pytest.mark.long  # the default run stays under 8 minutes on 2 cores
def test_accumulate_auto_fits_the_cap_and_the_summary_says_so(tiny_config, tmp_path):
    from trainer.run.end.summary import format_summary
    from trainer.run.train import train

    summary = train(tiny_config(*CONFIG, "devices=2", "batch.accumulate=auto",
                                "batch.max_per_replica=20"), run_dir=tmp_path / "run")
    assert (summary["batch"]["per_replica"], summary["batch"]["accumulate"]) == (16, 4)
    assert ("128 = 16 x 2 replicas x 4 micro-batches accumulated per optimizer step"
            in format_summary(summary))
