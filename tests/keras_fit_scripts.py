"""Two Keras scripts as users write them, ported by changing `model.fit(` to
`trainer.fit(model, ` (tests/test_fit_as_model_fit.py runs each as `python script.py`).

`COMPILED`: a compiled model instance and arrays, `fit(x, y, batch_size, epochs,
validation_split, callbacks, shuffle)`, beside plain Keras's `model.fit` with the same
arguments; a callback of the script's own counts epochs and batches.

`DATASETS`: TensorFlow's multi-worker tutorial's form: module-level `tf.data` datasets, one
`map` with a Python `if` on a tensor (AutoGraph's to convert), `repeat()` and
`steps_per_epoch`, and a builder that adapts a layer on the module-level dataset.
"""

COMPILED = '''
import json
import sys

import keras
import numpy as np

import trainer

rng = np.random.default_rng(0)
x = rng.normal(size=(200, 6)).astype("float32")
y = np.digitize(x[:, 0] + x[:, 1], [-0.5, 0.5]).astype("int32")


def make():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


class Count(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs, self.batches = 0, 0

    def on_epoch_end(self, epoch, logs=None):
        self.epochs += 1

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1


plain = make()
plain.fit(x, y, batch_size=32, epochs=2, validation_split=0.2, shuffle=False, verbose=0)
model = make()
cb = Count()
result = trainer.fit(model, x, y, batch_size=32, epochs=2, validation_split=0.2,
                     callbacks=[cb], shuffle=False, devices=int(sys.argv[1]),
                     accelerator="cpu", verbose=0, overrides=["logger=[]"])
print("RESULT", json.dumps({
    "diff": max(float(np.abs(a - b).max())
                for a, b in zip(plain.get_weights(), model.get_weights())),
    "epochs": cb.epochs, "batches": cb.batches, "replicas": result.summary["replicas"],
    "batch": result.summary["batch"], "lr": result.summary["learning_rate"]}))
'''

DATASETS = '''
import json
import sys

import keras
import numpy as np
import tensorflow as tf

import trainer

rng = np.random.default_rng(0)
x = rng.normal(size=(256, 6)).astype("float32")
y = np.digitize(x[:, 0] + x[:, 1], [-0.5, 0.5]).astype("int32")


def clip(features, label):
    if tf.reduce_max(features) > 2.0:  # a Python `if` on a tensor
        features = tf.clip_by_value(features, -2.0, 2.0)
    return features, label


train_ds = tf.data.Dataset.from_tensor_slices((x[:192], y[:192])).map(clip).batch(32)
val_ds = tf.data.Dataset.from_tensor_slices((x[192:], y[192:])).map(clip).batch(32)
normalizer = keras.layers.Normalization()


def build():
    normalizer.adapt(train_ds.map(lambda f, label: f))  # a module-level dataset
    model = keras.Sequential([keras.Input((6,)), normalizer,
                              keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


result = trainer.fit(build, train_ds.repeat(), epochs=2, steps_per_epoch=3,
                     validation_data=val_ds, devices=int(sys.argv[1]), accelerator="cpu",
                     verbose=0, overrides=["logger=[]"])
print("RESULT", json.dumps({"replicas": result.summary["replicas"],
                            "steps": result.summary["steps_per_epoch"],
                            "val_accuracy": result.history["val_accuracy"]}))
'''

# A first step that does not return to Python for two minutes, as a long first compile
# (XLA) holds the main thread in TensorFlow's C++ code: `MARK` is made when it begins.
HELD = '''
import os
import time

import keras
import numpy as np
import tensorflow as tf

import trainer


def slow():
    if not os.path.exists(os.environ["MARK"]):
        open(os.environ["MARK"], "w").close()
        time.sleep(120)
    return np.float32(0.0)


class Slow(keras.layers.Layer):
    def call(self, x, training=False):
        if training:
            x = x + tf.reshape(tf.numpy_function(slow, [], tf.float32), [])
        return x


def build():
    return keras.Sequential([keras.Input((4,)), Slow(),
                             keras.layers.Dense(3, activation="softmax")])


x, y = np.random.rand(64, 4).astype("float32"), np.random.randint(0, 3, 64)
trainer.fit(build, x, y, epochs=1, devices=1, overrides=["logger=[]"], run_dir="run")
'''


# A porting.md block's form: `import keras` before `import trainer` (TensorFlow's C++ log
# level read then), 2 replicas in this process; the script writes lines of its own to stderr.
IMPORTED_FIRST = '''
import json
import sys

import keras
import numpy as np

import trainer


class Say(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print(f"the script's own line, epoch {epoch}", file=sys.stderr, flush=True)


def build():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy")
    return model


rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x[:, 0] > 0).astype("int32")
result = trainer.fit(build, x, y, batch_size=16, epochs=2, validation_split=0.25,
                     devices=2, accelerator="cpu", verbose=0, callbacks=[Say()],
                     overrides=["logger=[]"])
print("RESULT", json.dumps({"replicas": result.summary["replicas"]}))
'''
