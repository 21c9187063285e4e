"""The Keras contract scoreboard: every scenario of Keras's own tests (`keras/src/models/
model_test.py`, `keras/src/trainers/trainer_test.py`) that trains, trained by trainer and by
plain Keras's `fit` on one device, side by side (the scenarios: `keras_scenarios.py`).

Each scenario's data are 251 training examples (a last batch of 59, split unevenly over 2
replicas) and 29 for validation, trained for one epoch (the scenario's `epochs`: two where
what it tests happens in the second). Plain Keras's `fit` trains it on one device over the
batches trainer makes (same order); trainer trains it through the whole run
(`trainer.run.train.train`, the builder, data and config as a user gives them) with
`loop=fit` on 1 and 2 replicas and `loop=custom` on 2, and with `--workers` also on 2 worker
processes (`python -m trainer.launch --workers 2`, `strategy=multi_worker loop=custom`) for
a few representative scenarios. A cell is:

- `pass`: the weights within 1e-5 of plain Keras's, the same history keys, and every logged
  number (training and validation, every epoch) within 1e-5 too;
- `differs`: with the largest relative difference of the weights, or the keys that differ,
  or the logged metric that differs (a metric logged wrong is a silent difference);
- `refused`: a one-line `ConfigError`, trainer saying why;
- `traceback`: anything else (a bug).

With `--reordered` a first column holds plain Keras again, each batch's examples reversed
(only the order of the sums changes): a scenario that is not `pass` there is too sensitive to
rounding for its other cells to judge trainer.

    python scripts/keras_contract.py                  # every scenario, 3 columns
    python scripts/keras_contract.py --list           # each Keras test: scenario, or why not
    python scripts/keras_contract.py --only list_outputs,subclassed --columns fit:1
    python scripts/keras_contract.py --workers        # adds the 2-workers column (slow)
    python scripts/keras_contract.py --reordered --columns ''  # is each scenario judgeable?
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))  # `_target_: keras_scenarios.X`

import keras_scenarios as ks  # noqa: E402

BATCH, SEED, TOLERANCE = 64, 42, 1e-5
COLUMNS = (("fit", 1), ("fit", 2), ("custom", 2))
# The 2-workers column's scenarios: list and dict outputs, a subclassed model, a model's own
# train_step and compute_loss, sample weights.
WORKER_SCENARIOS = ("list_outputs", "dict_outputs", "subclassed", "own_train_step",
                    "own_compute_loss", "sample_weights")
WORKER_TIMEOUT = 300


# -- plain Keras ----------------------------------------------------------------------------

def _optimizer(name: str | None):
    import keras

    return keras.optimizers.SGD(ks.LR) if name is None else getattr(
        keras.optimizers, name.capitalize())(ks.LR)


def _reversed(*batch):
    """A batch with its examples in reverse order (the same sums, added in another order)."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda t: t if t is None else tf.reverse(t, [0]), batch)


def plain_keras(name: str, reorder: bool = False) -> tuple[list, dict[str, list[float]]]:
    """Plain Keras's `fit` on one device over trainer's batches: (weights, history).

    With `reorder`, each training batch's examples come in reverse order: only the order in
    which the loss and gradients are summed changes. A scenario whose weights then move more
    than the tolerance cannot tell a weighting bug from rounding (2 replicas add each
    gradient in another order too), and its cells mean nothing."""
    import keras

    from trainer.config.validate import runtime_seed
    from trainer.data.pipeline import (
        Batches,
        Epochs,
        Order,
        build_pipeline,
        build_training_epochs,
    )

    scenario = ks.SCENARIOS[name]
    # trainer seeds TensorFlow's global seed too: tf.data's shuffle order depends on it
    keras.utils.set_random_seed(runtime_seed(SEED))
    source = ks.make_source(name, runtime_seed(SEED))
    model = scenario.build()
    if scenario.compile is not None:
        options = dict(scenario.compile)
        # Keras's test anchors steps_per_execution=3 on the same model at 1 (plain Keras at 3
        # over a repeated dataset runs a chunk past an epoch's end)
        options.pop("steps_per_execution", None)
        model.compile(_optimizer(options.pop("optimizer", None)), **options)
    epochs = build_training_epochs(source.train, Batches(BATCH, 1, source.train_size),
                                   Epochs(0, scenario.epochs),
                                   order=Order(seed=runtime_seed(SEED)))
    if reorder:
        epochs = epochs.map(_reversed)
    validation = build_pipeline(source.validation, Batches(BATCH, 1, source.validation_size),
                                training=False)
    history = model.fit(epochs, epochs=scenario.epochs,
                        steps_per_epoch=-(-source.train_size // BATCH),
                        validation_data=validation, verbose=0,
                        class_weight=scenario.class_weight,
                        callbacks=[make() for make in scenario.callbacks])
    return model.get_weights(), {k: [float(v) for v in vs] for k, vs in history.history.items()}


# -- trainer --------------------------------------------------------------------------------

def overrides(name: str, loop: str, replicas: int) -> list[str]:
    """The run's Hydra overrides: the scenario's model and data by `_target_`, its own
    overrides (the YAML path), SGD's fixed rate and the shared batch, seed and epochs. No
    best checkpoint: a cell compares the last weights and the logs, which it does not change
    (it is saved, not loaded: no test split)."""
    scenario = ks.SCENARIOS[name]
    return [f"model._target_=keras_scenarios.model_{name}",
            f"dataset._target_=keras_scenarios.data_{name}", f"loop={loop}",
            "accelerator=cpu", f"devices={replicas}", f"epochs={scenario.epochs}",
            f"seed={SEED}", "batch.per_replica=null", f"batch.global_size={BATCH}",
            "optimizer.lr_scaling=none", "deterministic=true", "verbose=0",
            "logger=[]", "checkpoint.monitor=val_loss", "checkpoint.save_best=false",
            *scenario.overrides]


def with_trainer(name: str, loop: str, replicas: int) -> tuple[list, dict[str, list[float]]]:
    """trainer's run of the scenario in this process: (weights, history)."""
    import keras
    from hydra import compose, initialize_config_dir

    from trainer.config.schema import config_dir
    from trainer.run.train import train

    class Keep(keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            self.weights = self.model.get_weights()

    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=overrides(name, loop, replicas))
    keep = Keep()
    with tempfile.TemporaryDirectory() as run_dir, open(os.devnull, "w") as quiet, \
            contextlib.redirect_stdout(quiet):  # the run's summary
        summary = train(cfg, run_dir=run_dir, callbacks=[keep])
    return keep.weights, summary["history"]


def with_workers(name: str, workers: int = 2) -> tuple[list, dict[str, list[float]]]:
    """trainer's run on `workers` local worker processes (`python -m trainer.launch`,
    `strategy=multi_worker loop=custom`), one replica each, with a hard timeout; every
    process the launcher started is stopped with it (its own process group)."""
    import numpy as np

    from trainer.config.errors import ConfigError

    with tempfile.TemporaryDirectory() as tmp:
        run_dir, scratch = Path(tmp) / "run", Path(tmp) / "scratch"
        scratch.mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "HYDRA_FULL_ERROR")}
        env.update(PYTHONPATH=os.pathsep.join([str(REPO), str(HERE)]), TMPDIR=str(scratch),
                   TF_CPP_MIN_LOG_LEVEL="2")
        args = [a for a in overrides(name, "custom", 1) if not a.startswith("devices=")]
        command = [sys.executable, "-m", "trainer.launch", "--workers", str(workers),
                   "--grace", "10", *args, "strategy=multi_worker", "devices=1",
                   "+callbacks.keep._target_=keras_scenarios.SaveWeights",
                   f"+callbacks.keep.filename={ks.SAVED_WEIGHTS}",  # inside each run dir
                   f"hydra.run.dir={run_dir}"]
        log = Path(tmp) / "launch.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(command, cwd=tmp, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=WORKER_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RuntimeError(f"2 workers still running after {WORKER_TIMEOUT} s") from None
        output = log.read_text()
        if code != 0:
            said = [line.split("error: ", 1)[1] for line in output.splitlines()
                    if "error: " in line]
            if code == 2 and said:  # trainer's exit code for a refused config, its one line
                raise ConfigError(said[-1])
            raise RuntimeError(f"exit {code}: {output[-400:]}")
        history = json.loads((run_dir / "summary.json").read_text())["history"]
        saved = np.load(run_dir / ks.SAVED_WEIGHTS)
        return [saved[f"w{i}"] for i in range(len(saved.files))], history


# -- the table ------------------------------------------------------------------------------

def compare(reference: tuple[list, dict], got: tuple[list, dict]) -> str:
    """`pass`, or `differs: ...` naming what differs: the history keys, the logged numbers
    (the first metric off, its largest relative difference), the weights."""
    import numpy as np

    (want_weights, want_history), (weights, history) = reference, got
    history = {k: v for k, v in history.items() if k != "learning_rate"}
    if set(history) != set(want_history):
        return f"differs: keys {sorted(set(history) ^ set(want_history))}"
    found = []
    for key in sorted(want_history):
        a, b = np.asarray(history[key]), np.asarray(want_history[key])
        if a.shape != b.shape:
            found.append(f"logged {key}: {len(a)} epochs vs {len(b)}")
        elif not np.allclose(a, b, rtol=TOLERANCE, atol=1e-6):
            off = [k for k in sorted(want_history) if np.shape(history[k]) == np.shape(
                want_history[k]) and not np.allclose(history[k], want_history[k],
                                                     rtol=TOLERANCE, atol=1e-6)]
            worst = float(np.max(np.abs(a - b) / (np.abs(b) + 1e-6)))
            found.append(f"logged {', '.join(off)} ({key} {worst:.0e})")
        if found:
            break
    if len(weights) != len(want_weights):
        found.append(f"{len(weights)} weights vs {len(want_weights)}")
    elif not all(np.allclose(a, b, rtol=TOLERANCE, atol=1e-6)
                 for a, b in zip(weights, want_weights, strict=True)):
        worst = max(float(np.max(np.abs(a - b) / (np.abs(b) + 1e-6)))
                    for a, b in zip(weights, want_weights, strict=True))
        found.append(f"weights {worst:.0e}")
    elif found:
        found.append("weights pass")
    return "differs: " + "; ".join(found) if found else "pass"


def cell(reference: tuple[list, dict], run) -> str:
    """One cell of the table: pass, differs, refused or traceback."""
    from trainer.config.errors import ConfigError

    try:
        got = run()
    except ConfigError as error:
        return f"refused: {str(error).splitlines()[0]}"
    except Exception as error:  # noqa: BLE001 - the scoreboard reports every failure
        lines = str(error).strip().splitlines() or [""]
        return f"traceback: {type(error).__name__}: {lines[0][:120]}"
    return compare(reference, got)


def start(devices: int) -> None:
    """Splits the CPU into logical devices before TensorFlow's runtime starts."""
    import logging

    import tensorflow as tf

    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * devices)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    from trainer.config.schema import register_configs

    register_configs()


def row(name: str, columns, workers: bool, reordered: bool = False) -> list[str]:
    try:
        reference = plain_keras(name)
    except Exception as error:  # noqa: BLE001 - the scenario itself is broken
        return [name, f"plain Keras failed: {type(error).__name__}: {error}"[:160]]
    cells = [cell(reference, lambda: plain_keras(name, reorder=True))] if reordered else []
    cells += [cell(reference, lambda loop=loop, r=r: with_trainer(name, loop, r))
              for loop, r in columns]
    if workers:
        cells.append(cell(reference, lambda: with_workers(name)) if name in WORKER_SCENARIOS
                     else "")
    return [name, *cells]


def _columns(text: str):
    return tuple((loop, int(r)) for loop, r in (c.split(":") for c in text.split(",") if c))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="scenarios, comma-separated")
    parser.add_argument("--list", action="store_true",
                        help="each Keras test: its scenarios, or why it does not apply")
    parser.add_argument("--columns", default=",".join(f"{lp}:{r}" for lp, r in COLUMNS),
                        help="loop:replicas, comma-separated (default: %(default)s)")
    parser.add_argument("--workers", action="store_true",
                        help=f"add the 2-workers column ({', '.join(WORKER_SCENARIOS)})")
    parser.add_argument("--reordered", action="store_true",
                        help="first, plain Keras with each batch's examples reversed: a "
                             "scenario that differs there cannot judge the others")
    parser.add_argument("--json", default="", help="also write the rows to this file")
    args = parser.parse_args()
    if args.list:
        for test, fate in ks.listing():
            print(f"{test}: {fate}")
        return 0
    chosen = [s for s in (args.only.split(",") if args.only else ks.SCENARIOS) if s]
    unknown = sorted(set(chosen) - set(ks.SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios {unknown}; known: {', '.join(ks.SCENARIOS)}")
    columns = _columns(args.columns)
    start(max([r for _, r in columns] + [1]))
    header = ["scenario", *(["keras reordered"] if args.reordered else []),
              *(f"{loop} x{r}" for loop, r in columns)]
    header += ["custom 2 workers"] if args.workers else []
    rows, began = [], time.monotonic()
    for name in chosen:
        rows.append(row(name, columns, args.workers, args.reordered))
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for line in rows:
        print("| " + " | ".join(line) + " |")
    print(f"\n{len(rows)} scenarios in {time.monotonic() - began:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
