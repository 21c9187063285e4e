"""How far one last bit carries: plain Keras, one device, the default CNN without dropout on
the bundled digits, plain SGD at 0.05, one epoch at a batch of 64, trained from the same
weights and again with ONE of its 619,146 weights moved by one unit in the last place.

Prints the largest difference relative to each weight's largest value. A rerun is 0; most
moved weights end about 1e-7 apart; some end about 1e-2 apart (measured: 1.4e-2 for
dense/kernel[105, 971] with the first shuffle): ReLU and max-pooling route each gradient by
a comparison, ties are common on 8x8 digits, and a last-bit difference that flips one
comparison sends the run down another branch. Two runs whose arithmetic differs anywhere (a
sum over 64 examples against two over 32, three micro-batches accumulated against an
all-reduce's order) can therefore end that far apart, and only runs that compute the same
sums bit for bit are exact across device counts (docs/devices-and-performance.md).

    python scripts/ulp_probe.py [--shuffle N] [--moves K]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shuffle", type=int, default=0, help="seed of the data's order")
    parser.add_argument("--moves", type=int, default=4, help="single weights to move")
    args = parser.parse_args()

    import keras
    import numpy as np
    from sklearn.datasets import load_digits

    from trainer.models.cnn import build

    x, y = load_digits(return_X_y=True)
    x = (x.reshape(-1, 8, 8, 1) / 16.0).astype("float32")
    order = np.random.default_rng(args.shuffle).permutation(len(x))[:1437]
    x, y = x[order], y[order].astype("int64")
    keras.utils.set_random_seed(0)
    start = build((8, 8, 1), 10, dropout=0.0).get_weights()

    def trained(weights):
        model = build((8, 8, 1), 10, dropout=0.0)
        model.set_weights(weights)
        model.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy")
        model.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False)
        return model.get_weights()

    def apart(a, b):
        return max(float(np.max(np.abs(p - q)) / max(np.max(np.abs(p)), 1e-12))
                   for p, q in zip(a, b, strict=True))

    base = trained(start)
    print(f"rerun from the same weights: {apart(base, trained(start)):.1e}")
    rng = np.random.default_rng(1)
    kernel = 6  # dense/kernel, 128 x 1024
    for _ in range(args.moves):
        moved = [w.copy() for w in start]
        at = tuple(int(rng.integers(0, s)) for s in moved[kernel].shape)
        moved[kernel][at] = np.nextafter(moved[kernel][at], np.float32(np.inf))
        print(f"dense/kernel{list(at)} moved by one last bit: {apart(base, trained(moved)):.1e}")


if __name__ == "__main__":
    main()
