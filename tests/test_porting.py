"""docs/porting.md's keras.io examples, extracted and run as written (#50).

Each `<!-- port: NAME/keras -->` block is a Keras script in the form of a keras.io example,
and its `<!-- port: NAME/trainer -->` block the same script for trainer: the port changes at
most 5 lines (indentation aside), and runs as written on 1 device and on 2 replicas, with
`trainer.fit` shortened to one quiet epoch on logical CPU devices. The data a block names
and does not make is the example's own, made here small and of the same form (integer class
labels where the example has them), as keras.io loads it.
"""

from __future__ import annotations

import difflib
import json
import re

import numpy as np
import pytest
import tensorflow as tf

import trainer
from tests.conftest import REPO
from tests.test_multiworker import launches

__all__ = ["launches"]  # the fixture, imported for the test below

# The most lines a port may change (indentation aside).
MOST_CHANGED = 5


def ports() -> dict[str, str]:
    text = (REPO / "docs" / "porting.md").read_text()
    return dict(re.findall(r"<!-- port: (\S+) -->\n```python\n(.*?)```", text, re.S))


def changed_lines(before: str, after: str) -> int:
    """Lines the port adds or rewrites (a rewritten line counts once), indentation and
    blank lines aside."""
    def lines(code: str) -> list[str]:
        return [line.strip() for line in code.splitlines() if line.strip()]

    diff = list(difflib.ndiff(lines(before), lines(after)))
    added = sum(1 for d in diff if d.startswith("+ "))
    removed = sum(1 for d in diff if d.startswith("- "))
    return max(added, removed)


def _labels(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 2, size=(n,)).astype("int64")


def structured() -> dict:
    rng = np.random.default_rng(0)

    def split(n):
        features = {"age": rng.normal(50, 9, n).astype("float32"),
                    "chol": rng.normal(240, 40, n).astype("float32"),
                    "sex": rng.integers(0, 2, n).astype("int64"),
                    "cp": rng.integers(0, 4, n).astype("int64")}
        return tf.data.Dataset.from_tensor_slices((features, _labels(n, rng))).batch(32)

    return {"train_ds": split(64), "val_ds": split(32), "numeric_features": ["age", "chol"],
            "categorical_features": ["sex", "cp"]}


def text() -> dict:
    rng = np.random.default_rng(1)
    words = np.array(["good", "bad", "film", "plot", "great", "awful", "actor", "the"])

    def split(n):
        reviews = [" ".join(rng.choice(words, 12)) for _ in range(n)]
        return tf.data.Dataset.from_tensor_slices((reviews, _labels(n, rng))).batch(32)

    return {"raw_train_ds": split(64), "raw_val_ds": split(32)}


def timeseries() -> dict:
    rng = np.random.default_rng(2)
    found = {"past": 60, "step": 6, "batch_size": 32}  # keras.io's: 720, 6, 256
    for role, n in (("train", 120), ("val", 90)):
        x = rng.normal(size=(n, 7)).astype("float32")
        found[f"x_{role}"], found[f"y_{role}"] = x, np.roll(x[:, 1:2], -6, axis=0)
    return found


def images() -> dict:
    rng = np.random.default_rng(3)

    def split(n):
        pixels = rng.integers(0, 256, size=(n, 32, 32, 3)).astype("float32")
        return tf.data.Dataset.from_tensor_slices((pixels, _labels(n, rng))).batch(16)

    return {"train_ds": split(32), "val_ds": split(16), "image_size": (32, 32)}


def vae() -> dict:
    digits = np.random.default_rng(4).uniform(size=(64, 28, 28, 1)).astype("float32")
    return {"mnist_digits": digits}


def functional() -> dict:
    rng = np.random.default_rng(5)
    n = 64
    return {"title_data": rng.integers(10000, size=(n, 10)),
            "body_data": rng.integers(10000, size=(n, 20)),
            "tags_data": rng.integers(2, size=(n, 12)).astype("float32"),
            "priority_targets": rng.random(size=(n, 1)),
            "dept_targets": rng.integers(2, size=(n, 4))}


def tf_distributed() -> dict:
    """MNIST as `tfds.load("mnist", as_supervised=True)` gives it: unbatched (28x28x1 uint8
    image, int64 label) pairs."""
    rng = np.random.default_rng(6)

    def split(n):
        pixels = rng.integers(0, 256, size=(n, 28, 28, 1)).astype("uint8")
        return tf.data.Dataset.from_tensor_slices((pixels, rng.integers(0, 10, n)))

    return {"mnist_train": split(256), "mnist_test": split(64)}


# The multi-worker tutorial reads TF_CONFIG: it runs on 2 workers (its own test below), not
# in this process; its data are MNIST's as `tf.keras.datasets.mnist.load_data` loads them.
MNIST_LOADED = """
import numpy as np
import tensorflow as tf


def _load_data():
    rng = np.random.default_rng(7)
    x = rng.integers(0, 256, size=(512, 28, 28)).astype("uint8")
    y = rng.integers(0, 10, size=512).astype("uint8")
    return (x, y), (x[:64], y[:64])


tf.keras.datasets.mnist.load_data = _load_data  # no download here
"""

EXAMPLES = {
    "structured": structured,
    "text": text,
    "timeseries": timeseries,
    "images": images,
    "vae": vae,
    "functional": functional,
    "tf_distributed": tf_distributed,
    "multiworker": None,
}


def test_every_example_of_the_doc_is_tested_and_ports_in_few_lines():
    found = ports()
    assert sorted({name.split("/")[0] for name in found}) == sorted(EXAMPLES)
    for name in EXAMPLES:
        changed = changed_lines(found[f"{name}/keras"], found[f"{name}/trainer"])
        assert changed <= MOST_CHANGED, (name, changed)


def _cases():
    for name in EXAMPLES:
        if EXAMPLES[name] is None:
            continue  # on several workers: its own test
        for devices in (1, 2):
            yield pytest.param(name, devices, id=f"{name}-{devices}")


@pytest.mark.parametrize("name, devices", list(_cases()))
def test_a_ported_example_trains_as_written(tmp_path, monkeypatch, name, devices):
    """The trainer block as written, in a script's `__main__` with the example's data: one
    quiet epoch on `devices` logical CPUs (the block's own devices and epochs replaced)."""
    fit = trainer.fit

    def shortened(*args, **kwargs):
        if args and isinstance(args[0], (list, tuple)):  # the command line's form
            kept = [o for o in args[0] if not o.startswith(("devices=", "epochs="))]
            return fit([*kept, "accelerator=cpu", f"devices={devices}", "epochs=1",
                        "verbose=0", "logger=[]"], *args[1:], run_dir=tmp_path / "run",
                       **kwargs)
        kwargs.update(devices=devices, accelerator="cpu", epochs=1, verbose=0,
                      run_dir=tmp_path / "run",
                      overrides=[*kwargs.get("overrides", ()), "logger=[]"])
        return fit(*args, **kwargs)

    monkeypatch.setattr(trainer, "fit", shortened)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__", **EXAMPLES[name]()}
    exec(compile(ports()[f"{name}/trainer"], f"{name}.py", "exec"), namespace)  # noqa: S102
    result = namespace["result"]
    assert result.summary["replicas"] == devices and result.summary["epochs_done"] == 1
    assert np.isfinite(result.history["loss"][0])


def test_the_docs_table_of_changed_lines_is_what_the_ports_change():
    """docs/porting.md's table: each example's changed lines (`diff -w`, as counted above)
    and raw `diff` lines, as the blocks have them."""
    found = ports()
    text = (REPO / "docs" / "porting.md").read_text()
    rows = re.findall(r"^\| ([^|]+?) \| (\d+) \| (\d+) \|$", text, re.M)
    names = {"structured data": "structured", "text": "text",
             "time series (a callback)": "timeseries", "images": "images",
             "VAE": "vae", "functional API, two outputs": "functional",
             "TensorFlow's distributed Keras tutorial": "tf_distributed",
             "TensorFlow's multi-worker tutorial": "multiworker"}
    assert [row[0] for row in rows] == list(names)
    for shown, changed, raw in rows:
        before, after = found[f"{names[shown]}/keras"], found[f"{names[shown]}/trainer"]
        diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        counted = sum(1 for d in diff if d[:1] in "+-" and not d.startswith(("+++", "---")))
        assert (int(changed), int(raw)) == (changed_lines(before, after), counted), shown


@pytest.mark.multiworker
def test_the_multi_worker_tutorials_port_trains_on_two_workers_as_written(tmp_path, launches):
    """The tutorial's port as written (its own `TF_CONFIG` reading included), one quiet short
    epoch, as `python -m trainer.launch --workers 2 script.py`: each worker joins the
    cluster, the global batch is the script's 64 per worker on 2."""
    block = ports()["multiworker/trainer"]
    assert "epochs=3,\n                     steps_per_epoch=70)" in block
    block = block.replace("epochs=3,\n                     steps_per_epoch=70)",
                          "epochs=1, steps_per_epoch=2, verbose=0, overrides=['logger=[]'])")
    (tmp_path / "script.py").write_text(
        MNIST_LOADED + block + '\nprint("RESULT", json.dumps({"replicas": '
        'result.summary["replicas"], "batch": result.summary["batch"]["global"], '
        '"steps": result.summary["steps_per_epoch"]}))\n')
    launch = launches(2, "script.py")
    assert launch.wait(timeout=300) == 0, launch.output[-3000:]
    found = [json.loads(text) for text in re.findall(r"^\[worker \d\] RESULT (.*)$",
                                                     launch.output, re.M)]
    assert found == [{"replicas": 2, "batch": 128, "steps": 2}] * 2, launch.output[-3000:]
