"""The config: composition, typed schema, validation, and finding conf/ from anywhere."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from tests.conftest import REPO, make_config
from trainer.config.errors import ConfigError
from trainer.config.metrics import monitor_mode
from trainer.config.validate import parse_devices
from trainer.run.prepare.preflight import check_config as validate


def test_default_config_composes_and_validates():
    cfg = make_config()
    validate(cfg)
    assert cfg.model._target_ == "trainer.models.cnn.build"
    assert cfg.dataset._target_ == "trainer.data.digits.load"
    assert cfg.strategy.name == "auto" and cfg.optimizer._target_ == "keras.optimizers.Adam"
    assert cfg.devices == "auto" and cfg.accelerator == "auto"
    assert cfg.batch.per_replica == 64 and cfg.batch.global_size is None


def test_group_options_compose():
    cfg = make_config("model=mobilenet", "dataset=synthetic", "strategy=mirrored",
                      "optimizer=sgd_momentum_cosine")
    assert cfg.model.alpha == 0.35 and cfg.dataset.channels == 3
    assert cfg.strategy.name == "mirrored" and cfg.optimizer.momentum == 0.9


@pytest.mark.parametrize("model, dataset, size", [
    ("cnn", "digits", 8), ("mobilenet", "digits", 32), ("keras_app", "digits", 32),
    ("cifar10_cnn", "digits", 8), ("mobilenet", "synthetic", 32), ("mobilenet", "mnist", 32),
    ("cnn", "mnist", 28), ("mobilenet", "cats_vs_dogs", 224), ("mobilenet", "cifar10", 32),
])
def test_the_built_in_datasets_follow_the_models_smallest_input(model, dataset, size):
    cfg = make_config(f"model={model}", f"dataset={dataset}")
    assert cfg.dataset.image_size == size
    validate(cfg)


def test_image_size_choice_says_what_raised_it():
    from trainer.config.image_size import describe_choice, image_size_choice

    raised = image_size_choice(make_config("model=mobilenet"))
    assert raised == {"size": 32, "own": 8, "minimum": 32}
    assert describe_choice(raised, "mobilenet", "digits") == (
        "32x32: dataset=digits is 8x8, resized up to the smallest side model=mobilenet takes "
        "(model.min_image_size=32)")
    assert image_size_choice(make_config()) == {"size": 8, "own": 8, "minimum": None}
    given = image_size_choice(make_config("model=mobilenet", "dataset.image_size=48"))
    assert given == {"size": 48, "own": 48, "minimum": 32}
    assert describe_choice(given, "mobilenet", "digits").startswith("48x48 (dataset.image_size")
    # a model that resizes its inputs itself takes any size: the dataset keeps its own
    resizing = make_config("model=keras_app", "model.input_size=64")
    assert resizing.dataset.image_size == 8 and image_size_choice(resizing)["minimum"] is None
    assert image_size_choice(make_config("dataset=tfds", "dataset.name=mnist")) is None


def test_an_explicit_image_size_below_the_models_minimum_is_one_line():
    with pytest.raises(ConfigError) as error:
        validate(make_config("model=mobilenet", "dataset.image_size=8"))
    assert str(error.value) == (
        "dataset.image_size=8 is below the smallest side model=mobilenet takes, 32x32 "
        "(model.min_image_size); leave dataset.image_size out (the built-in datasets follow the "
        "model's minimum) or set it >= 32")
    validate(make_config("model=keras_app", "model.input_size=32", "dataset.image_size=8"))


@pytest.mark.parametrize("override", ["epochs=x", "model.alpha=0.5", "nonsense=1",
                                      "dataset.image_size=big"])
def test_wrong_type_or_unknown_key_fails_at_compose_time(override):
    with pytest.raises(ConfigCompositionException):
        make_config(override)


def test_compose_and_validate_do_not_import_tensorflow():
    code = ("import sys; from hydra import compose, initialize_config_dir;"
            "from trainer.config.schema import config_dir, register_configs;"
            "from trainer.run.prepare.preflight import check_config as validate;"
            "from trainer.config.errors import ConfigError;"
            "register_configs();"
            "ctx = initialize_config_dir(str(config_dir()), version_base='1.3'); ctx.__enter__();"
            "cfg = compose('config', overrides=['epochs=0']);"
            "exec('try:\\n validate(cfg)\\nexcept ConfigError: pass');"
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("overrides, message", [
    (["epochs=0"], "epochs must be a positive integer; received: 0"),
    (["epochs=-3"], "received: -3"),
    (["batch.per_replica=0"], "batch.per_replica must be a positive integer; received: 0"),
    (["batch.per_replica=null", "batch.global_size=-8"], "batch.global_size must be a positive"),
    (["batch.global_size=128"], "set exactly one of batch.per_replica and batch.global_size"),
    (["batch.per_replica=null"], "received: per_replica=None, global_size=None"),
    (["accelerator=tpu"], "accelerator must be one of auto, gpu, cpu; received: 'tpu'"),
    (["strategy.name=horovod"], "strategy.name must be one of auto, mirrored"),
    (["strategy.cross_device_ops=mpi"], "strategy.cross_device_ops must be one of"),
    (["optimizer.lr=0"], "optimizer.lr must be positive; received: 0"),
    (["optimizer.lr_scaling=cubic"], "optimizer.lr_scaling must be one of linear, sqrt, none"),
    (["optimizer.decay=step"], "optimizer.decay must be one of none, cosine"),
    (["devices=0"], "devices must be auto, a positive count or a list of indices; received: 0"),
    (["devices=[1,1]"], "distinct non-negative indices; received: [1, 1]"),
    (["devices=[]"], "received: []"),
    (["devices=many"], "received: 'many'"),
    (["verbose=7"], "verbose must be 0 (silent), 1 (progress bar), 2 (a line per epoch) or "
                    "auto; received: 7"),
    (["verbose=-1"], "received: -1"),
    (["verbose=loud"], "received: 'loud'"),
    (["verbose=true"], "received: True"),
    (["verbose=1.5"], "received: 1.5"),
])
def test_validation_names_the_bad_value(overrides, message):
    with pytest.raises(ConfigError, match=None) as info:
        validate(make_config(*overrides))
    assert message in str(info.value)


@pytest.mark.parametrize("verbose", ["0", "1", "2", "auto"])
def test_every_verbose_keras_takes_validates(verbose):
    validate(make_config(f"verbose={verbose}"))


def test_parse_devices_forms():
    assert parse_devices("auto") == "auto"
    assert parse_devices(3) == 3
    assert parse_devices(OmegaConf.create({"d": [0, 2]}).d) == (0, 2)
    with pytest.raises(ConfigError):
        parse_devices(True)


def test_plain_install_finds_its_configs_from_another_directory(tmp_path):
    """A non-editable install ships conf/ inside the package; Hydra must find it there."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(REPO)],
                   check=True, timeout=300, capture_output=True)
    assert (target / "trainer" / "conf" / "model" / "cnn.yaml").is_file()
    code = ("import trainer.config.schema as c, pathlib;"
            "from hydra import compose, initialize_config_dir;"
            "c.register_configs(); d = c.config_dir(); assert 'site' in str(d), d;"
            "initialize_config_dir(str(d), version_base='1.3').__enter__();"
            "cfg = compose('config', overrides=['model=mobilenet']); print(cfg.model.alpha)")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=elsewhere, env={"PYTHONPATH": str(target),
                                                          "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0.35"


@pytest.mark.parametrize("monitor, mode, expected", [
    ("val_accuracy", "auto", "max"), ("accuracy", "auto", "max"), ("val_loss", "auto", "min"),
    ("val_auc", "auto", "max"), ("val_accuracy", "min", "min"), ("val_thing", "max", "max"),
])
def test_monitor_mode(monitor, mode, expected):
    assert monitor_mode(monitor, mode) == expected


def test_monitor_mode_unknown_metric():
    with pytest.raises(ConfigError, match="checkpoint.monitor='val_thing'"):
        monitor_mode("val_thing")


@pytest.mark.parametrize("override, said", [
    ("gpu.memory_growth=2", "gpu.memory_growth must be true or false; received: 2"),
    ("sync_batchnorm=2", "sync_batchnorm must be true or false; received: 2"),
    ("deterministic=2", "deterministic must be true or false; received: 2"),
    ("deterministic=yes", "deterministic must be true or false; received: 'yes'"),
    ("gpu.memory_growth=maybe", "gpu.memory_growth must be true or false; received: 'maybe'"),
    ("batch.drop_remainder=1", "batch.drop_remainder must be true or false; received: 1"),
    ("cluster.port_base=70000", "cluster.port_base must be a port number, 1 to 65535; "
     "received: 70000"),
    ("cluster.port_base=-1", "cluster.port_base must be a port number, 1 to 65535; "
     "received: -1"),
    ("strategy.communication=pigeon", "strategy.communication must be one of auto, ring, "
     "nccl; received: 'pigeon'"),
])
def test_switches_and_ports_are_checked_as_such_not_coerced(override, said):
    """A bool field of the schema would take `2` or `yes` as true without a word, and any
    integer as a port: each is one line naming the value and what is valid."""
    with pytest.raises(ConfigError) as error:
        validate(make_config(override))
    assert str(error.value) == said
    validate(make_config("deterministic=true", "gpu.memory_growth=false"))
