"""An evaluator beside the workers: what the chief and the evaluator hand each other through
the run directory, and the decisions on it (which epoch is next, whether it is the best, who
validated). A decide module: no TensorFlow.

The evaluator is a process of its own, outside the MultiWorkerMirroredStrategy cluster (as
TensorFlow's SidecarEvaluator was); the workers never wait for it while they train. They
talk through files in `RUN_DIR/evaluator/`, each written whole under a temporary name and
renamed (or hard-linked, which is atomic too):

```
evaluator/inbox/epoch-000003.weights.h5   the chief's epoch-3 backup weights (a hard link:
                                          the backup rotation cannot take them away)
evaluator/inbox/epoch-000003.json         that epoch's training logs; written after the
                                          weights, so its presence says the entry is whole
evaluator/history.jsonl                   the evaluator's record, one line per epoch
evaluator/trained.json                    the chief: training ended after N epochs
evaluator/summary.json                    the evaluator: every epoch validated, the test
```

The chief writes `summary.json` once, whole: at its end it writes `trained.json`, waits (at
most `strategy.start_timeout_s`) for the evaluator's `summary.json`, and merges it into its
own (`merged`); an evaluator that died or is late leaves the summary saying validation was
incomplete.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainer.config.errors import ConfigError
from trainer.rundir.atomic import write_json

_ENTRY = re.compile(r"epoch-(\d{6})\.json")


@dataclass(frozen=True)
class EvaluatorDir:
    """The paths of `RUN_DIR/evaluator/`."""

    root: Path

    @classmethod
    def of(cls, run_dir: Path) -> EvaluatorDir:
        return cls(Path(run_dir) / "evaluator")

    @property
    def inbox(self) -> Path:
        return self.root / "inbox"

    def weights(self, epoch: int, suffix: str = ".weights.h5") -> Path:
        """An epoch's weights in the inbox (`.keras` where the backup linked a checkpoint)."""
        return self.inbox / f"epoch-{epoch:06d}{suffix}"

    def logs(self, epoch: int) -> Path:
        return self.inbox / f"epoch-{epoch:06d}.json"

    @property
    def history(self) -> Path:
        return self.root / "history.jsonl"

    @property
    def trained(self) -> Path:
        return self.root / "trained.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"


def ready_epochs(inbox: Path, done: set[int] = frozenset()) -> list[int]:
    """The epochs (from 1) whose inbox entry is whole (its `.json` is there) and not yet
    evaluated, oldest first: the evaluator takes every epoch in order, never skips one."""
    if not inbox.is_dir():
        return []
    found = {int(m.group(1)) for m in map(_ENTRY.fullmatch, (p.name for p in inbox.iterdir()))
             if m}
    return sorted(found - set(done))


def improved(value: float, best: float | None, mode: str) -> bool:
    """Whether `value` beats `best` (`min` or `max`); ties keep the earlier epoch, as Keras's
    ModelCheckpoint does; a value that is not finite never improves."""
    if not math.isfinite(value):
        return False
    if best is None:
        return True
    return value < best if mode == "min" else value > best


def read_history(path: Path) -> list[dict[str, Any]]:
    """The evaluator's records so far (empty where it has none)."""
    try:
        text = path.read_text()
    except OSError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def write_history(path: Path, records: list[dict[str, Any]]) -> None:
    """Writes every record, one JSON line each, to a temporary name renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)


def best_record(records: list[dict[str, Any]], monitor: str, mode: str) -> dict | None:
    """The record of the best epoch by `monitor` (the earliest of equals)."""
    best = None
    for record in records:
        value = record.get(monitor)
        if value is not None and improved(float(value), None if best is None
                                          else float(best[monitor]), mode):
            best = record
    return best


def check_with_evaluator(spec: Any) -> None:
    """Refuses what needs validation on the workers while they train: they do not wait for
    the evaluator, so a callback that reads a validation metric (early stopping, a plateau)
    would read nothing; so would the k best checkpoints and their average.

    Raises:
        ConfigError: naming the key.
    """
    for name, node in (spec.callbacks or {}).items():
        monitor = str((node or {}).get("monitor", ""))
        if monitor.startswith("val_"):
            raise ConfigError(f"callbacks.{name} monitors {monitor}, which the evaluator "
                              "computes after the workers have moved on; with an evaluator, "
                              f"monitor a training metric or remove it; received: {monitor}")
    saving = spec.checkpoint
    for key, value in (("keep_best", saving.keep_best), ("average_best", saving.average_best)):
        if value:
            raise ConfigError(f"checkpoint.{key} is not kept with an evaluator (it keeps "
                              f"best.keras alone); set checkpoint.{key}=0; received: {value}")
    if spec.optimizer.get("use_ema"):
        raise ConfigError("optimizer.use_ema with an evaluator: the evaluator validates the "
                          "backups' raw weights; set optimizer.use_ema=false; received: true")


def without_validation(spec: Any) -> Any:
    """The workers' spec with an evaluator: `best.keras` is the evaluator's to write."""
    return replace(spec, checkpoint=replace(spec.checkpoint, save_best=False))


def final_summary(records: list[dict[str, Any]], trained: dict[str, Any], best: dict | None,
                  test: dict | None, test_checkpoint: str | None) -> dict[str, Any]:
    """The evaluator's result (`evaluator/summary.json`), for the chief to merge."""
    epochs = [int(r["epoch"]) for r in records]
    wanted = list(range(1, int(trained.get("epochs_done", 0)) + 1))
    keys = [k for k in (records[-1] if records else {}) if k.startswith("val_")]
    return {"epochs": epochs, "epochs_trained": len(wanted),
            "complete": all(e in epochs for e in wanted),
            "validation_metrics": {k[4:]: records[-1][k] for k in keys},
            "history": {k: [r.get(k) for r in records] for k in keys},
            "best": best, "test_metrics": test, "test_checkpoint": test_checkpoint}


def merged(summary: dict[str, Any], result: dict[str, Any] | None, why: str | None = None
           ) -> dict[str, Any]:
    """The chief's summary with the evaluator's validation, test and history in it;
    `result` None: the evaluator gave none (`why`), and the summary says so."""
    found = dict(summary)
    if result is None:
        found["validated_by"] = {"task": "evaluator", "complete": False, "why": why}
        return found
    history = dict(found.get("history") or {})
    history.update(result["history"])
    found.update(history=history, validation_metrics=result["validation_metrics"],
                 test_metrics=result["test_metrics"], test_checkpoint=result["test_checkpoint"])
    found["validated_by"] = {"task": "evaluator", "complete": bool(result["complete"]),
                             "epochs": result["epochs"], "best": result["best"],
                             "why": None if result["complete"] else
                             f"epochs {_missing(result)} were not validated"}
    return found


def _missing(result: dict[str, Any]) -> str:
    gone = sorted(set(range(1, result["epochs_trained"] + 1)) - set(result["epochs"]))
    return ", ".join(map(str, gone))


def validated_line(validated: dict[str, Any] | None) -> str | None:
    """The summary's `validated by` row: None where the chief validated."""
    if not validated:
        return None
    if not validated.get("complete"):
        return f"the evaluator, incomplete: {validated.get('why')}"
    epochs, best = validated.get("epochs") or [], validated.get("best")
    chosen = f"; best.keras is epoch {best['epoch']}" if best else ""
    return f"the evaluator ({len(epochs)} epochs{chosen})"


def clear_result(place: EvaluatorDir) -> None:
    """Removes an earlier end's `trained.json` and result: a resumed run ends anew."""
    for path in (place.trained, place.summary):
        path.unlink(missing_ok=True)


def await_result(place: EvaluatorDir, epochs_done: int, timeout_s: float | None,
                 poll_s: float = 0.5) -> tuple[dict | None, str | None]:
    """The chief's end: says training ended (`trained.json`), then waits at most
    `timeout_s` (None: no limit) for the evaluator's result.

    Returns:
        (result, None), or (None, why) where none came in time.
    """
    write_json(place.trained, {"epochs_done": epochs_done})
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while deadline is None or time.monotonic() < deadline:
        try:
            result = json.loads(place.summary.read_text())
        except (OSError, ValueError):
            time.sleep(poll_s)
            continue
        if result.get("epochs_trained") == epochs_done:
            return result, None
        time.sleep(poll_s)
    return None, (f"the evaluator gave no result within {timeout_s:g} s "
                  "(strategy.start_timeout_s) of the end of training")
