"""Restoring a finished or interrupted run on this machine's devices, for evaluation and
prediction (a training run resumes from its backup in `trainer.run.assembly.resume`).

`restore_run` is what `trainer.evaluate`, `trainer.predict` and the Python API go through:
the run's config composed again (`trainer.run.prepare.reopen`), its strategy, data and model built
as training built them (`trainer.run.assembly.assemble`) on the devices the overrides ask for, the
data checked against the fingerprint the run kept, and the chosen checkpoint loaded
(checked against its hash). A checkpoint as a Keras model of its own is
`trainer.run.assembly.load.load_checkpoint`, kept here under its old name.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from trainer.config.errors import ConfigError
from trainer.config.messages import one_line
from trainer.data.fingerprint import check_same_data, of_source
from trainer.data.image_folder import undecodable
from trainer.data.pipeline import Batches, Prep, build_pipeline
from trainer.distribute.devices import open_devices
from trainer.run.assembly.assemble import Run, assemble
from trainer.run.assembly.load import load_checkpoint  # noqa: F401 - restore's public name too
from trainer.run.prepare.reopen import Reopened, reopen, trained_on
from trainer.run.prepare.resolve import Spec
from trainer.rundir.checkpoint import verified


@dataclass(frozen=True)
class Restored:
    """A finished (or interrupted) run rebuilt on this machine's devices, its checkpoint
    loaded."""

    spec: Spec
    run: Run
    checkpoint: Path

    @property
    def replicas(self) -> int:
        """Replicas in sync on this machine."""
        return self.run.strategy.num_replicas_in_sync


def restore_run(run: str | Path | Reopened, overrides: list[str] = (),
                same_data: bool = True) -> Restored:
    """A run's model, data and strategy on this machine's devices, with the checkpoint
    `checkpoint=best|last|averaged` names loaded.

    Args:
        run: a run directory (composed again with `overrides`), or a run `reopen`ed already.
        overrides: `key=value` changes to the run's config.
        same_data: refuse data other than the run trained on (evaluation); False where only
            the source's preprocessing is used (prediction of a run that recorded its
            classes), which must still give the model as many outputs as it trained with.

    Raises:
        ConfigError: not a run, a checkpoint that is missing or damaged, data that changed
            since the run trained; one line each.
    """
    opened = run if isinstance(run, Reopened) else reopen(run, list(overrides))
    built = assemble(opened.spec, open_devices(opened.spec.devices))
    source = built.data.source
    if same_data:
        check_same_data(opened.run_dir, trained_on(opened.run_dir), of_source(source))
    elif opened.inputs is not None and opened.inputs.get("num_outputs") != source.num_outputs:
        raise ConfigError(_other_outputs(opened, source))
    load_weights_checked(built.model, opened.checkpoint, opened.which)
    return Restored(opened.spec, built, opened.checkpoint)


def _other_outputs(opened: Reopened, source: Any) -> str:
    """The line for a dataset that now gives the model another number of outputs."""
    def counted(count: Any, names: Any) -> str:
        return (f"{count} classes ({', '.join(names)})" if names
                else f"{count} outputs")

    return (f"the dataset of {opened.run_dir} now gives "
            f"{counted(source.num_outputs, source.class_names)}, the run trained on "
            f"{counted(opened.inputs.get('num_outputs'), opened.inputs.get('class_names'))}; "
            "prediction builds the run's preprocessing from its dataset: restore it")


def load_weights_checked(model: Any, checkpoint: Path, which: str) -> None:
    """Loads a checkpoint checked against its hash; damage is one line naming the file and
    the other checkpoint to use."""
    other = "last" if which != "last" else "best"
    verified(checkpoint)
    try:
        with warnings.catch_warnings():
            # the optimizer's state is in the file; evaluation does not need it
            warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
            model.load_weights(checkpoint)
    except Exception as error:  # noqa: BLE001 - a damaged file fails in many ways
        raise ConfigError(f"{checkpoint} does not load ({one_line(error)}); use "
                          f"checkpoint={other}, or retrain") from None


def predict_outputs(run: Any, inputs: Any, examples: int) -> Any:
    """The model's outputs for every example once, in input order."""
    source = run.data.source
    features = ({k: tf.constant(v) for k, v in inputs.items()} if isinstance(inputs, dict)
                else tuple(map(tf.constant, inputs)) if isinstance(inputs, tuple)
                else tf.constant(inputs))
    elements = tf.data.Dataset.from_tensor_slices((features, tf.zeros([examples], tf.int32)))
    expected = source.train.element_spec[0]
    found = elements.element_spec[0]
    if _shapes(found) != _shapes(expected) and source.preprocess is None:
        raise ConfigError(f"the input's examples have the shape {_shapes(found)}; the run "
                          f"was trained on {_shapes(expected)}")
    # Every replica computes batches of exactly `per_replica` examples (the last padded
    # with copies of the first example, cut off after): the same shapes, so the same
    # kernels, whatever the device count (outputs agree to float32 rounding: the threads
    # replicas share may change a kernel's order of summation).
    per_replica, replicas = run.batch.per_replica, run.batch.replicas
    global_batch = per_replica * replicas
    padded = -(-examples // global_batch) * global_batch
    if padded > examples:
        elements = elements.concatenate(elements.take(1).repeat(padded - examples))
    batches = build_pipeline(elements, Batches(global_batch, replicas, padded), training=False,
                             prep=Prep(source.preprocess, source.scale, cache="none"))
    only_inputs = batches.map(lambda x, *rest: x)
    try:
        found = run.model.predict(only_inputs, verbose=0)
    except (tf.errors.InvalidArgumentError, ValueError) as error:
        bad = (undecodable(list(inputs), error) if isinstance(inputs, list) and inputs
               and isinstance(inputs[0], str) else None)  # image files, by path
        if bad is not None:
            raise ConfigError(f"input: {bad} does not decode as an image; remove it from the "
                              "input or replace it with a good copy (nothing written)") from None
        raise ConfigError(f"the model cannot take these inputs ({one_line(error)}); the run "
                          f"was trained on examples of shape {_shapes(expected)}") from None
    if isinstance(found, dict):
        return {k: np.asarray(v)[:examples] for k, v in found.items()}
    if isinstance(found, (list, tuple)):
        return [np.asarray(v)[:examples] for v in found]
    return np.asarray(found)[:examples]


def _shapes(spec: Any) -> Any:
    if isinstance(spec, dict):
        return {k: _shapes(v) for k, v in spec.items()}
    return tuple(spec.shape)
