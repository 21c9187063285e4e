"""Every contact with Keras's, TensorFlow's and Hydra's internals, in one room.

Keras keeps each backend's code in `keras/src/backend/<name>/`, Lightning its framework
shims in one file; trainer keeps here every name it reaches that its dependencies do not
export: `keras.src`, `tensorflow.python`, `hydra._internal`, private attributes of Keras's
objects (`model._compute_loss`, the loss trackers, `_maybe_symbolic_build`, ...) and the
replacement of Keras's methods (`make_train_function`, `evaluate`, a tracker's
`update_state`). Nothing else in `trainer/` names them (`tests/test_layout.py` checks it
against `PRIVATE_NAMES`), so an upgrade that breaks one breaks a function here, which
`scripts/check_versions.py` names.

Each module was written for the versions in `TESTED`: a newer or older one is one warning
line at import (`check_version`), not an error: the code may still work, and
`scripts/check_versions.py` tells.

Modules: `keras_step` (the training and test step's contacts), `keras_compile` (losses,
metrics, saving), `keras_data` (class weights as Keras's data adapter applies them),
`keras_callbacks` (the progress bar's and checkpoint's hooks), `keras_optimizer` (the
optimizer's moving average of the weights: kept aside in `fit`, swapped in on demand),
`tf_runtime` (op determinism, registered kernels, whether the runtime started), `tf_start`
(TensorFlow's start-up notices kept off stderr; no TensorFlow), `tf_data` (the batch a user's
dataset was built with), `hydra_app` (Hydra's argument parser and config loader; no
TensorFlow). This package imports nothing of ours: it is the floor below `config/`.
"""

from __future__ import annotations

import sys

# The oldest and newest major.minor each dependency was tested with (pyproject.toml's bounds
# agree: tests/test_versions.py).
TESTED = {"keras": ("3.13", "3.15"), "tensorflow": ("2.19", "2.21"),
          "hydra-core": ("1.3", "1.3")}

# The private names of Keras, TensorFlow and Hydra that only this package may use.
PRIVATE_NAMES = (
    "keras.src", "tensorflow.python", "hydra._internal", "_compute_loss", "_loss_tracker",
    "_compile_loss", "_compile_metrics", "_compile_config", "_flat_losses", "_direction",
    "_call_has_training_arg", "_get_regularization_losses", "_flatten_layers",
    "_symbolic_build", "_maybe_symbolic_build", "_get_metrics_result_or_logs",
    "make_train_function", "_update_progbar", "_get_file_path", "_save_model",
    "_trainable_variables", "_input_dataset", "_batch_size", "_batch_sizes", "_save_state",
    "_return_value", "_as_serialized_graph",
)

_warned: set[str] = set()


def _minor(version: str) -> tuple[int, int]:
    parts = version.split(".")
    return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)


def untested(package: str, version: str) -> str | None:
    """The warning for a version outside `TESTED`, or None for a tested one.

    Args:
        package: a key of `TESTED` (`keras`, `tensorflow`, `hydra-core`).
        version: the installed version, e.g. `3.16.0`.

    Returns:
        One line naming the package, its version, the tested range and what to run.
    """
    low, high = TESTED[package]
    if _minor(low) <= _minor(version) <= _minor(high):
        return None
    tested = low if low == high else f"{low} to {high}"
    return (f"warning: {package} {version} is not a version trainer was tested with "
            f"({tested}.x); check it with `python scripts/check_versions.py --newest` in "
            "trainer's repository, or install the tested set with `-c constraints.txt`")


def check_version(package: str, version: str) -> None:
    """Prints `untested`'s line once per process for an untested version."""
    message = untested(package, version)
    if message is not None and package not in _warned:
        _warned.add(package)
        print(message, file=sys.stderr, flush=True)
