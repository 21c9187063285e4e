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
    keras.utils.set_random_seed(1)
    normalizer.adapt(train_ds.map(lambda f, label: f))  # a module-level dataset
    model = keras.Sequential([keras.Input((6,)), normalizer,
                              keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


result = trainer.fit(build, train_ds.repeat(), epochs=2, steps_per_epoch=3,
                     validation_data=val_ds, shuffle=False, devices=int(sys.argv[1]),
                     accelerator="cpu", verbose=0, overrides=["logger=[]"])
found = {"replicas": result.summary["replicas"], "steps": result.summary["steps_per_epoch"],
         "val_accuracy": result.history["val_accuracy"]}
if sys.argv[1] == "1" and result.summary["cluster"] is None:  # beside plain Keras's fit
    plain = build()
    plain.fit(train_ds.repeat(), epochs=2, steps_per_epoch=3, validation_data=val_ds,
              verbose=0)
    ours = keras.saving.load_model(result.checkpoints["last"])
    found["diff"] = max(float(np.abs(a - b).max())
                        for a, b in zip(plain.get_weights(), ours.get_weights()))
print("RESULT", json.dumps(found))
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


# keras.io's VAE as written (docs/porting.md's block), ported: `vae.fit(` -> `trainer.fit(vae, `.
VAE = '''
import json
import sys

import keras
import numpy as np
import tensorflow as tf

import trainer

mnist_digits = np.random.default_rng(0).random((256, 28, 28, 1)).astype("float32")

class Sampling(keras.layers.Layer):
    def call(self, inputs):
        z_mean, z_log_var = inputs
        epsilon = tf.random.normal(shape=tf.shape(z_mean))
        return z_mean + tf.exp(0.5 * z_log_var) * epsilon

latent_dim = 2
encoder_inputs = keras.Input(shape=(28, 28, 1))
x = keras.layers.Conv2D(32, 3, activation="relu", strides=2, padding="same")(encoder_inputs)
x = keras.layers.Conv2D(64, 3, activation="relu", strides=2, padding="same")(x)
x = keras.layers.Dense(16, activation="relu")(keras.layers.Flatten()(x))
z_mean = keras.layers.Dense(latent_dim, name="z_mean")(x)
z_log_var = keras.layers.Dense(latent_dim, name="z_log_var")(x)
z = Sampling()([z_mean, z_log_var])
encoder = keras.Model(encoder_inputs, [z_mean, z_log_var, z], name="encoder")
latent_inputs = keras.Input(shape=(latent_dim,))
x = keras.layers.Dense(7 * 7 * 64, activation="relu")(latent_inputs)
x = keras.layers.Reshape((7, 7, 64))(x)
x = keras.layers.Conv2DTranspose(64, 3, activation="relu", strides=2, padding="same")(x)
x = keras.layers.Conv2DTranspose(32, 3, activation="relu", strides=2, padding="same")(x)
decoder_outputs = keras.layers.Conv2DTranspose(1, 3, activation="sigmoid", padding="same")(x)
decoder = keras.Model(latent_inputs, decoder_outputs, name="decoder")

class VAE(keras.Model):
    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder, self.decoder = encoder, decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [self.total_loss_tracker, self.kl_loss_tracker]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            reconstruction_loss = tf.reduce_mean(tf.reduce_sum(
                keras.losses.binary_crossentropy(data, reconstruction), axis=(1, 2)))
            kl_loss = -0.5 * (1 + z_log_var - tf.square(z_mean) - tf.exp(z_log_var))
            kl_loss = tf.reduce_mean(tf.reduce_sum(kl_loss, axis=1))
            total_loss = reconstruction_loss + kl_loss
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_loss_tracker.update_state(total_loss)
        self.kl_loss_tracker.update_state(kl_loss)
        return {"loss": self.total_loss_tracker.result(),
                "kl_loss": self.kl_loss_tracker.result()}

vae = VAE(encoder, decoder)
vae.compile(optimizer=keras.optimizers.Adam())
before = [w.copy() for w in vae.get_weights()]
result = trainer.fit(vae, mnist_digits, epochs=1, batch_size=128, devices=int(sys.argv[1]),
                     accelerator="cpu", verbose=0, overrides=["logger=[]"])
print("RESULT", json.dumps({
    "replicas": result.summary["replicas"], "loss": result.history["loss"],
    "batch": result.summary["batch"]["global"],
    "moved": max(float(np.abs(a - b).max()) for a, b in zip(before, vae.get_weights()))}))
'''
