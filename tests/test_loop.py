"""Proof that the replica count does not change the maths, for `fit` and `loop=custom`.

K steps of plain SGD on fixed data and initial weights must give the same weights and the
same reported loss on 1, 2 and 4 replicas at the same global batch. A loop that averages the
loss over the per-replica batch (the classic bug) must fail the same check.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.distribute.runtime import build_strategy
from trainer.internals.keras_step import build_from_one_replica
from trainer.run.assembly.accumulate import accumulating_train_step
from trainer.run.assembly.step import exact_test_step, exact_train_step
from trainer.run.fit.loop import CustomLoop

GLOBAL_BATCH, EXAMPLES, FEATURES, CLASSES = 16, 64, 12, 5
RTOL = 1e-5
# One test process for the module: its tests share their one-replica runs (`train_with`).
pytestmark = pytest.mark.xdist_group("test_loop.runs")


def make_data(examples: int = EXAMPLES, seed: int = 3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(examples, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=examples).astype("int32")
    return x, y


def batches(x, y, batch=GLOBAL_BATCH):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def make_model(kind: str) -> keras.Model:
    init = keras.initializers.GlorotUniform(seed=1)
    reg = keras.regularizers.L2(0.05) if kind == "l2" else None
    inputs = keras.Input((FEATURES,))
    x = keras.layers.Dense(16, kernel_initializer=init, kernel_regularizer=reg)(inputs)
    if kind == "batchnorm":
        x = keras.layers.BatchNormalization(synchronized=True)(x)
    x = keras.layers.Activation("relu")(x)
    outputs = keras.layers.Dense(CLASSES, activation="softmax", kernel_initializer=init,
                                 kernel_regularizer=reg)(x)
    return keras.Model(inputs, outputs)


INITIAL = {}


def build(kind: str, strategy) -> keras.Model:
    """The same initial weights on every replica count."""
    if kind not in INITIAL:
        INITIAL[kind] = make_model(kind).get_weights()
    with strategy.scope():
        model = make_model(kind)
        model.set_weights(INITIAL[kind])
        model.compile(optimizer=keras.optimizers.SGD(0.5),
                      loss=keras.losses.SparseCategoricalCrossentropy(), metrics=["accuracy"])
    return model


def strategy_for(replicas: int):
    name = "one_device" if replicas == 1 else "mirrored"
    ops = "none" if replicas == 1 else "collective"
    return build_strategy(name, tuple(f"/cpu:{i}" for i in range(replicas)), ops)


TRAINED = {}


def train_with(loop: str, kind: str, replicas: int, examples=EXAMPLES, step: str = "exact",
               weights=None):
    """Both loops run trainer's exact step (`step="keras"`: Keras's own, the negative
    control; `"accumulate"`: 2 micro-batches per replica), `fit` or the custom loop driving
    the epochs; `weights` adds per-example sample weights. A run is made once per test
    process: several tests compare with the same one-replica reference."""
    key = (loop, kind, replicas, examples, step, None if weights is None else weights.tobytes())
    if key not in TRAINED:
        TRAINED[key] = _train_with(loop, kind, replicas, examples, step, weights)
    return TRAINED[key]


def _train_with(loop, kind, replicas, examples, step, weights):
    strategy = strategy_for(replicas)
    model = build(kind, strategy)
    x, y = make_data(examples)
    steps = -(-examples // GLOBAL_BATCH)
    data = (batches(x, y) if weights is None
            else tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(GLOBAL_BATCH))
    if step == "exact":
        model.train_step = exact_train_step(model)
    elif step == "accumulate":
        model.train_step = accumulating_train_step(model, 2)
    if loop == "fit":
        build_from_one_replica(model)
        history = model.fit(data, epochs=2, verbose=0, shuffle=False)
    else:
        # The custom loop reads all epochs from one dataset, as fit does with steps_per_epoch.
        history = CustomLoop(model, strategy, steps_per_execution=3).fit(
            data.repeat(2), epochs=2, steps_per_epoch=steps, verbose=0)
    return model.get_weights(), history.history["loss"]


def assert_same(reference, other):
    (w1, loss1), (w2, loss2) = reference, other
    for a, b in zip(w1, w2, strict=True):
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=1e-6)
    np.testing.assert_allclose(loss2, loss1, rtol=RTOL)


@pytest.mark.parametrize("loop", ["fit", "custom"])
@pytest.mark.parametrize("kind", ["plain", "l2", "batchnorm"])
def test_replica_count_does_not_change_weights_or_loss(loop, kind):
    """4 replicas (a quarter of each batch each); 2 are in the tests below."""
    one = train_with(loop, kind, 1)
    assert not np.allclose(one[0][0], INITIAL[kind][0])  # it did train
    assert_same(one, train_with(loop, kind, 4))


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_partial_last_batch_weighs_like_one_replica(loop):
    """50 examples: the last global batch of 2 is split 1/1 on 2 replicas and 1/1/0/0 on 4:
    every example must still weigh 1/(examples in the step)."""
    one = train_with(loop, "l2", 1, examples=50)
    for replicas in (2, 4):
        assert_same(one, train_with(loop, "l2", replicas, examples=50))


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_sample_weights_and_accumulation_are_exact_on_an_uneven_last_batch(loop):
    weights = np.random.default_rng(5).uniform(0.1, 2.0, size=53).astype("float32")
    one = train_with("fit", "plain", 1, examples=53, weights=weights)
    assert_same(one, train_with(loop, "plain", 2, examples=53, weights=weights))
    single = train_with("fit", "plain", 1, examples=53, step="keras")
    assert_same(single, train_with(loop, "plain", 1, examples=53, step="accumulate"))
    assert_same(single, train_with(loop, "plain", 2, examples=53, step="accumulate"))


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_negative_control_keras_per_replica_mean_differs_on_the_last_batch(loop):
    """Keras's own step averages per replica: on 53 examples (a last batch of 5, split 3/2)
    2 replicas end elsewhere than 1, which is what the exact step fixes, in either loop."""
    one = train_with("fit", "plain", 1, examples=53, step="keras")
    with pytest.raises(AssertionError):
        assert_same(one, train_with(loop, "plain", 2, examples=53, step="keras"))
    assert_same(one, train_with(loop, "plain", 2, examples=53))


@pytest.mark.parametrize("replicas", [1, 3, 4])
def test_custom_metrics_equal_fit_metrics(replicas):
    """Same weights, same 52 validation examples (not a multiple of the batch): same numbers."""
    strategy = strategy_for(replicas)
    model = build("l2", strategy)
    x, y = make_data(52, seed=9)
    batch = 5 * replicas  # the last batch is partial, and split unevenly over the replicas
    model.test_step = exact_test_step(model)  # what both loops evaluate with
    expected = model.evaluate(batches(x, y, batch), return_dict=True, verbose=0)
    got = CustomLoop(model, strategy).evaluate(batches(x, y, batch))
    assert got["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-7)
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    # Accuracy counts every example once: compare with numpy on one device.
    predictions = make_model("l2")
    predictions.set_weights(model.get_weights())
    labels = np.argmax(predictions.predict(x, verbose=0), axis=1)
    assert got["accuracy"] == pytest.approx(float(np.mean(labels == y)), abs=1e-7)
