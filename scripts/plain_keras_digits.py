"""The plain Keras script a user would write for trainer's default run, for `bench_run.py`.

The same model (trainer's `cnn`), data (scikit-learn's digits, the same fixed split, resized
to `--image-size`, scaled to [0, 1]), batch, optimizer (Adam at trainer's scaled rate), a
best-checkpoint callback, and a final test evaluation: what `python -m trainer` does, by hand.

    python scripts/plain_keras_digits.py --epochs 8 --image-size 16 --out /tmp/plain
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer.processes import process_seconds  # noqa: E402 - a leaf: no import of note

# The interpreter's start and `import keras, tensorflow`: what every Keras script pays
# before its first line of work (bench_run.py sets trainer's start-up beside it).
IMPORTED_S = process_seconds()

from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

from trainer.models.cnn import build  # noqa: E402 - the same network as trainer's default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--out", default="plain-run")
    args = parser.parse_args()
    keras.utils.set_random_seed(42)
    digits = load_digits()
    x = digits.images[..., None].astype("float32") / 16.0
    if args.image_size != 8:
        x = tf.image.resize(x, (args.image_size, args.image_size)).numpy()
    y = digits.target.astype("int32")
    x_train, x_held, y_train, y_held = train_test_split(x, y, test_size=0.2, random_state=0,
                                                        stratify=y)
    x_val, x_test, y_val, y_test = train_test_split(x_held, y_held, test_size=0.5,
                                                    random_state=0, stratify=y_held)
    model = build(x_train.shape[1:], 10)
    model.compile(keras.optimizers.Adam(args.lr), "sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "startup.json"), "w") as f:
        json.dump({"imported_s": IMPORTED_S}, f)
    best = keras.callbacks.ModelCheckpoint(os.path.join(args.out, "best.keras"),
                                           monitor="val_accuracy", save_best_only=True)
    model.fit(x_train, y_train, batch_size=args.batch, epochs=args.epochs,
              validation_data=(x_val, y_val), callbacks=[best], verbose=0)
    model = keras.models.load_model(os.path.join(args.out, "best.keras"))
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=args.batch, verbose=0)
    print(f"test accuracy {accuracy:.4f}  test loss {loss:.4f}  ({np.size(y_test)} examples)")


if __name__ == "__main__":
    main()
