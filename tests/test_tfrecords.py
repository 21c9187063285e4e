"""`dataset=tfrecord`: sharded TFRecord files of images (the ImageNet / Model Garden feature
names) or of any features (a spec from the config), and the writer of an image folder into
that layout (`python -m trainer.data.tfrecords IMAGES OUT --shards N`)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import tensorflow as tf
from conftest import error_lines, run_main

from trainer.data import image_folder, tfrecords
from trainer.run.train import train


def images(root, count=40):
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / ("dog" if i % 2 else "cat")
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (8, 8, 3)).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.png" if i % 4 else folder / f"{i}.jpg")
    return root


def test_the_writer_keeps_the_image_folders_split_and_decodes_alike(tmp_path, capsys):
    folder, out = images(tmp_path / "images"), tmp_path / "records"
    assert tfrecords.main([str(folder), str(out), "--shards", "3"]) == 0
    assert "wrote 32 train, 4 validation, 4 test records" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == [
        "classes.txt", "counts.json", *(f"test-0000{i}-of-00003" for i in range(3)),
        *(f"train-0000{i}-of-00003" for i in range(3)),
        *(f"validation-0000{i}-of-00003" for i in range(3))]
    assert json.loads((out / "counts.json").read_text()) == {"train": 32, "validation": 4,
                                                            "test": 4}
    records = tfrecords.load(str(out), image_size=8)
    folders = image_folder.load(str(folder), image_size=8)
    assert records.class_names == folders.class_names == ["cat", "dog"]
    assert (records.train_size, records.validation_size, records.test_size) == (32, 4, 4)
    decoded = {}
    for source, key in ((records, "records"), (folders, "folder")):
        found = [source.preprocess(*element) for element in source.train]
        decoded[key] = sorted((int(y), x.numpy().tobytes()) for x, y in found)
    assert decoded["records"] == decoded["folder"]  # the same images and labels
    # a second write into the same folder is refused in one line
    assert tfrecords.main([str(folder), str(out)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {out} already holds TFRecord shards")


def feature_records(root, count=120):
    """Rows of two inputs (4 numbers, a category) and two targets (a class, a score)."""
    rng = np.random.default_rng(0)
    root.mkdir()
    for role, rows in (("train", count), ("validation", count // 4)):
        with tf.io.TFRecordWriter(str(root / f"{role}-00000-of-00001")) as out:
            for _ in range(rows):
                num, cat = rng.normal(size=4).astype(np.float32), int(rng.integers(0, 5))
                label, score = int(num[0] + (cat == 2) > 0.5), float(2 * num[1] + cat)
                out.write(tf.train.Example(features=tf.train.Features(feature={
                    "num": tf.train.Feature(float_list=tf.train.FloatList(value=num)),
                    "cat": tf.train.Feature(int64_list=tf.train.Int64List(value=[cat])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                    "score": tf.train.Feature(float_list=tf.train.FloatList(value=[score])),
                })).SerializeToString())
    return root


MODEL = '''
import keras


def build(**_):
    num, cat = keras.Input((4,), name="num"), keras.Input((1,), name="cat")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(5, 3)(cat))
    hidden = keras.layers.Dense(16, "relu")(keras.layers.Concatenate()([num, embedded]))
    return keras.Model({"num": num, "cat": cat},
                       {"label": keras.layers.Dense(2, "softmax", name="label")(hidden),
                        "score": keras.layers.Dense(1, name="score")(hidden)})
'''


def test_records_of_named_features_train_a_model_of_two_inputs_and_two_outputs(
        tmp_path, tiny_config, monkeypatch):
    root = feature_records(tmp_path / "rows")
    (tmp_path / "rows_model.py").write_text(MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    summary = train(tiny_config(
        "dataset=tfrecord", f"dataset.path={root}", "dataset.num_classes=2",
        "dataset.features={num: {dtype: float32, shape: [4]}, cat: {dtype: int64, shape: [1]},"
        " label: {dtype: int64, shape: []}, score: {dtype: float32, shape: []}}",
        "dataset.inputs=[num,cat]", "dataset.outputs=[label,score]",
        "model._target_=rows_model.build", "optimizer.lr=0.01", "epochs=2",
        "loss={label: sparse_categorical_crossentropy, score: mse}",
        "metrics={label: [accuracy], score: [mae]}", "checkpoint.monitor=val_label_accuracy"),
        run_dir=tmp_path / "run")
    assert summary["train_examples"] == 120 and summary["validation_examples"] == 30
    assert set(summary["validation_metrics"]) >= {"label_accuracy", "score_mae"}
    assert summary["test_metrics"] is None


def test_a_damaged_record_is_one_line_naming_its_file_and_place(tmp_path):
    out = tmp_path / "records"
    tfrecords.write(str(images(tmp_path / "images")), str(out), 2)
    shard = out / "train-00001-of-00002"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped byte inside a record: its checksum fails
    shard.write_bytes(bytes(data))
    out_dir = tmp_path / "run"
    found = run_main("dataset=tfrecord", f"dataset.path={out}", "dataset.image_size=8",
                     "model=small", "epochs=1", "logger=[]", "verbose=0",
                     f"hydra.run.dir={out_dir}", cwd=tmp_path)
    lines = error_lines(found.stderr)
    assert found.returncode == 2 and len(lines) == 1, found.stderr[-2000:]
    assert lines[0].startswith("error: dataset=tfrecord: record ") and \
        f" of {shard} is damaged (" in lines[0], lines[0]


@pytest.mark.parametrize("files, message", [
    ([], "holds no train-* files"), (["train-0"], "holds no validation-* or val-* files")])
def test_a_folder_without_the_shards_is_one_line(tmp_path, files, message):
    for name in files:
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(tfrecords.DataError, match=re.escape(message)):
        tfrecords.load(str(tmp_path))
