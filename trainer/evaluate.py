"""`python -m trainer.evaluate RUN_DIR [overrides]`: evaluate a finished run's checkpoint.

The run is restored through `trainer.run.assembly.restore` (its saved config composed again by Hydra
over the schema with the overrides, e.g. `accelerator=cpu devices=2`, `checkpoint=last`, or
`split=test`; its strategy, data and model built as training built them; the checkpoint
loaded, checked against its hash), then every example of the validation split (or, with
`split=test`, the test split) is evaluated once. Prints the metrics as JSON; exit code 2 on
bad input.
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any

from trainer.config.errors import ConfigError
from trainer.config.given import holding
from trainer.config.outcome import as_overrides, one_error
from trainer.run import process
from trainer.run.prepare.place import reading
from trainer.run.prepare.reopen import SPLITS, take_choice

process.quiet_logs()


def evaluate_run(run_dir: str | Path, overrides: list[str] = ()) -> dict[str, Any]:
    """Evaluates a run's best (or, with `checkpoint=last`, last; `checkpoint=averaged`, its
    averaged model's) checkpoint.

    Args:
        run_dir: a run directory written by `python -m trainer`.
        overrides: `key=value` changes to the run's config, e.g. `devices=2`.

    Returns:
        `{"checkpoint": path, "split": ..., "examples": n, "replicas": n, "metrics": {...}}`.
    """
    split, rest = take_choice("split", SPLITS, list(overrides))
    # an entry point: the run's build modules import TensorFlow, started quietly by now
    from trainer.run.assembly.restore import restore_run
    from trainer.run.end.finish import evaluate_split

    with reading(run_dir) as place:  # a URL: a local copy of its run, removed after
        restored = restore_run(place.root, rest)
        run = restored.run
        data = run.data.validation if split == "validation" else run.data.test
        if data is None:
            other = "test" if split == "validation" else "validation"
            valid = (f"valid: split={other}" if getattr(run.data, other) is not None
                     else "it has neither a validation nor a test split")
            raise ConfigError(f"the dataset of {run_dir} has no {split} split; {valid}")
        metrics = evaluate_split(run, data)
        examples = (run.data.source.validation_size if split == "validation"
                    else run.data.source.test_size)
        return {"checkpoint": place.shown(str(restored.checkpoint)), "split": split,
                "examples": examples,
                "replicas": restored.replicas,
                "metrics": {k: float(v) for k, v in metrics.items()}}


def load_checkpoint(path: str | Path) -> Any:
    """A run's checkpoint as a Keras model (its hash checked, trainer's objects registered)."""
    # an entry point's public name: it imports Keras on first use
    from trainer.run.assembly.restore import load_checkpoint as load

    return load(path)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("error: usage: python -m trainer.evaluate RUN_DIR [key=value ...]; received "
              "nothing", file=sys.stderr)
        return 2
    sys.path.insert(0, os.getcwd())  # the user's own modules, as for training
    found = process.guarded(lambda: evaluate_run(args[0], args[1:]))
    if isinstance(found, int):
        return found
    print(json.dumps(found, indent=2))
    return 0


class _Callable(types.ModuleType):
    """`trainer.evaluate(...)`: the module, callable as the Python API's evaluation."""

    def __call__(self, run_dir: str | Path, overrides: list[str] = (), *, model: Any = None,
                 data: Any = None) -> dict[str, Any]:
        with one_error(), holding(model=model, data=data, batch_from_data=True):
            given = as_overrides(overrides, "trainer.evaluate")
            process.start_tensorflow()
            return evaluate_run(run_dir, given)


sys.modules[__name__].__class__ = _Callable


if __name__ == "__main__":
    raise SystemExit(main())
