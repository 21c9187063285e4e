"""The internals room's version check: a Keras, TensorFlow or Hydra outside the tested range
is one warning line at import, naming the version and what to run; a tested one is silent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import hydra
import keras
import tensorflow as tf

from trainer import internals

REPO = Path(__file__).resolve().parent.parent


def test_the_installed_versions_are_the_tested_ones():
    for package, version in (("keras", keras.__version__), ("tensorflow", tf.__version__),
                             ("hydra-core", hydra.__version__)):
        assert internals.untested(package, version) is None, (package, version)


def test_an_untested_version_is_one_line_naming_it_and_the_check():
    low, high = internals.TESTED["keras"]
    major, minor = high.split(".")
    newer = f"{major}.{int(minor) + 1}.0"
    line = internals.untested("keras", newer)
    assert line is not None and "\n" not in line
    assert line.startswith(f"warning: keras {newer} is not a version trainer was tested with")
    assert high in line and "scripts/check_versions.py" in line
    older = f"{low.split('.')[0]}.{int(low.split('.')[1]) - 1}.2"
    assert internals.untested("keras", older) is not None
    assert internals.untested("keras", f"{low}.0rc1") is None  # a pre-release of a tested minor


def test_the_warning_is_printed_once_per_package(capsys, monkeypatch):
    monkeypatch.setattr(internals, "_warned", set())
    monkeypatch.setitem(internals.TESTED, "keras", ("3.0", "3.0"))
    internals.check_version("keras", "3.99.1")
    internals.check_version("keras", "3.99.1")
    internals.check_version("tensorflow", tf.__version__)
    assert capsys.readouterr().err.splitlines() == [internals.untested("keras", "3.99.1")]


def test_importing_the_room_under_an_untested_keras_warns_once():
    """Every Keras-side module of the room checks at import; the process sees one line."""
    code = ("import trainer.internals as room; room.TESTED['keras'] = ('3.0', '3.0'); "
            "import trainer.internals.keras_step, trainer.internals.keras_compile, "
            "trainer.internals.keras_data, trainer.internals.keras_callbacks, "
            "trainer.internals.keras_optimizer")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=REPO, env={**os.environ,
                                                     "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert out.returncode == 0, out.stderr
    warned = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1
    assert warned[0].startswith(f"warning: keras {keras.__version__} is not a version trainer "
                                "was tested with (3.0.x)")


def test_the_saving_walk_computes_each_skip_set_once_per_process():
    """Keras's saving walk caches each object type's attribute skip-set under one name and
    reads it under another, so every layer it walks builds a reference `Layer()` again
    (0.1 s of each save and backup of MobileNetV2): trainer keeps one per type."""
    from keras.src.saving import saving_lib

    import trainer.internals.keras_compile  # noqa: F401 - installs it

    for kind in ("Layer", "Functional", "Optimizer"):
        assert saving_lib.get_attr_skipset(kind) is saving_lib.get_attr_skipset(kind)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    trainer.internals.keras_compile.weights_taken(model)  # the types' first walk
    made = []
    original = keras.layers.Layer.__init__

    def counted(self, *args, **kwargs):
        made.append(type(self))
        original(self, *args, **kwargs)

    keras.layers.Layer.__init__ = counted
    try:
        trainer.internals.keras_compile.weights_taken(model)
    finally:
        keras.layers.Layer.__init__ = original
    assert made == []  # no reference layer built during a walk again
