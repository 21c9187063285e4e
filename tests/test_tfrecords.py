"""`dataset=tfrecord`: sharded TFRecord files of images (the ImageNet / Model Garden feature
names) or of any features (a spec from the config), and the writer of an image folder into
that layout (`python -m trainer.data.tfrecords IMAGES OUT --shards N`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

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
    kept = json.loads((out / "counts.json").read_text())
    assert {role: kept[role] for role in ("train", "validation", "test")} == {
        "train": 32, "validation": 4, "test": 4}
    assert kept["files"]["train-00000-of-00003"]["bytes"] == (
        out / "train-00000-of-00003").stat().st_size
    assert sum(about["records"] for about in kept["files"].values()) == 40
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


def broken_png(folder):
    """One PNG of the folder replaced by bytes that start as a PNG and do not decode."""
    bad = folder / "cat" / "2.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"junk" * 10)
    return bad


def test_the_writer_refuses_an_image_that_does_not_decode_naming_it_and_writes_nothing(
        tmp_path, capsys):
    folder = images(tmp_path / "images")
    bad = broken_png(folder)
    out = tmp_path / "records"
    assert tfrecords.main([str(folder), str(out), "--shards", "2"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {bad} does not decode as an image ("), err
    assert err[0].endswith("or pass --on-bad skip")
    assert not out.exists()  # no shard of the bad write is left to train on


def test_the_writer_skips_and_counts_a_bad_image_saying_only_its_own_lines_and_the_records_train(
        tmp_path, tiny_config):
    """The command in a process of its own: no TensorFlow start-up notice around its lines."""
    import subprocess
    import sys

    folder = images(tmp_path / "images")
    bad = broken_png(folder)
    out = tmp_path / "records"
    done = subprocess.run([sys.executable, "-m", "trainer.data.tfrecords", str(folder), str(out),
                           "--shards", "2", "--on-bad", "skip"], capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in __import__("os").environ.items()
                                            if k not in ("TF_CPP_MIN_LOG_LEVEL",
                                                         "TRAINER_TF_LOGS")})
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert len(lines) == 2, lines
    kept = json.loads((out / "counts.json").read_text())
    assert kept["train"] + kept["validation"] + kept["test"] == 39  # of 40 images
    assert lines[0].startswith(f"wrote {kept['train']} train, {kept['validation']} validation, "
                               f"{kept['test']} test records to ")
    assert lines[1].startswith(f"skipped 1 image that does not decode (--on-bad skip), first "
                               f"{bad} (")
    summary = train(tiny_config("dataset=tfrecord", f"dataset.path={out}"),
                    run_dir=tmp_path / "run")
    assert summary["train_examples"] == kept["train"]


def test_an_output_path_that_is_a_file_is_one_line(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("mine")
    assert tfrecords.main([str(images(tmp_path / "images", 8)), str(taken)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {taken} is a file, not a folder; give a new folder for the shards"]
    assert taken.read_text() == "mine"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """An image folder's records, written once; each test changes a copy."""
    root = tmp_path_factory.mktemp("written")
    tfrecords.write(str(images(root / "images")), str(root / "records"), 2)
    return root / "records"


def copied(written, tmp_path):
    import shutil

    return Path(shutil.copytree(written, tmp_path / "records"))


def test_a_shard_cut_short_at_a_record_is_named_before_training(written, tmp_path):
    out = copied(written, tmp_path)
    shard = out / "train-00001-of-00002"
    data = shard.read_bytes()
    length = int.from_bytes(data[:8], "little")  # a TFRecord: length, crc, data, crc
    shard.write_bytes(data[:len(data) - (length + 16)])  # its last record gone, whole
    with pytest.raises(tfrecords.DataError, match=re.escape(
            f"dataset=tfrecord: {shard} is {shard.stat().st_size} bytes, but "
            f"{out / 'counts.json'} says {len(data)} were written (")):
        tfrecords.load(str(out), image_size=8)


def test_a_count_the_records_do_not_hold_names_counts_json(written, tmp_path):
    """A `counts.json` of the user's (no shard sizes) that claims more training records:
    tf.data's own words name neither the role's files nor counts.json."""
    out = copied(written, tmp_path)
    (out / "counts.json").write_text(json.dumps({"train": 40, "validation": 4, "test": 4}))
    source = tfrecords.load(str(out), image_size=8)
    with pytest.raises(tf.errors.OpError) as raised:
        for _ in source.train:
            pass
    assert source.explain(raised.value) == (
        "dataset=tfrecord: the train shards (train-00000-of-00002..., 2 files) hold only 32 "
        f"records, but {out / 'counts.json'} says 40: a shard was cut short, or counts.json "
        "is wrong; write the shards again, or delete counts.json (the records are then "
        "counted)")


@pytest.mark.parametrize("classes, message", [
    (None, "classes.txt is missing: image records need their class names, one per line in "
           "label order (the writer writes it), or dataset.num_classes"),
    ("cat\n", "classes.txt names 1 class (cat); a classifier needs at least 2, one name per "
              "line in label order")])
def test_a_missing_or_one_class_classes_txt_is_one_line_naming_it(written, tmp_path, classes,
                                                                  message):
    out = copied(written, tmp_path)
    if classes is None:
        (out / "classes.txt").unlink()
    else:
        (out / "classes.txt").write_text(classes)
    with pytest.raises(tfrecords.DataError, match=re.escape(f"dataset=tfrecord: {out}/{message}")):
        tfrecords.load(str(out), image_size=8)
    if classes is None:  # the number of classes given instead reads the records
        assert tfrecords.load(str(out), image_size=8, num_classes=2).num_classes == 2


def test_a_feature_spec_is_checked_against_the_first_record_naming_what_it_lacks(tmp_path):
    root = feature_records(tmp_path / "rows", count=8)
    spec = {"num": {"dtype": "float32", "shape": [4]}, "weight": {"dtype": "float32"},
            "label": {"dtype": "int64"}, "extra": {"dtype": "string"}}
    with pytest.raises(tfrecords.DataError, match=re.escape(
            f"dataset=tfrecord: record 0 of {root / 'train-00000-of-00001'} has no feature "
            "extra, weight (it has cat, label, num, score); name the records' features in "
            "dataset.features")):
        tfrecords.load(str(root), features=spec, inputs=["num", "weight", "extra"],
                       outputs="label")
    spec = {"num": {"dtype": "string"}, "label": {"dtype": "int64"}}
    with pytest.raises(tfrecords.DataError, match="num holds a float_list, not a bytes_list"):
        tfrecords.load(str(root), features=spec, inputs="num", outputs="label")


def test_the_data_changed_refusal_counts_records_not_shards(written):
    source = tfrecords.load(str(written), image_size=8)
    found = source.fingerprint()
    assert {role: found[role]["examples"] for role in found} == {
        "train": 32, "validation": 4, "test": 4}


def test_labels_beyond_the_classes_name_classes_txt(written):
    """Before training from the first record; mid-run from the loss's words."""
    first = written / "train-00000-of-00002"
    with pytest.raises(tfrecords.DataError, match=re.escape(
            f"dataset=tfrecord: record 0 of {first} has label ")) as refused:
        tfrecords.load(str(written), image_size=8, label_offset=2)
    assert f"but {written / 'classes.txt'} (or dataset.num_classes) counts 2 classes" in str(
        refused.value)
    source = tfrecords.load(str(written), image_size=8)
    error = tf.errors.InvalidArgumentError(None, None, "Received a label value of 7 which is "
                                           "outside the valid range of [0, 2).  Label values: 7")
    assert source.explain(error) == (
        f"dataset=tfrecord: a record under {written} has label 7, but the run has 2 classes "
        "(classes.txt or dataset.num_classes); list every class in classes.txt, in label "
        "order, or set dataset.label_offset")
