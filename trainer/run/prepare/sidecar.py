"""An evaluator beside the workers: what the chief and the evaluator hand each other through
the run directory, and the decisions on it (which epoch is next, whether it is the best, who
validated). A decide module: no TensorFlow.

The evaluator is a process of its own, outside the MultiWorkerMirroredStrategy cluster (as
TensorFlow's SidecarEvaluator was); the workers never wait for it while they train. They
talk through files in `RUN_DIR/evaluator/`, each written whole under a temporary name and
renamed (`trainer.rundir.atomic`):

```
evaluator/inbox/epoch-000003.weights.h5   the chief's epoch-3 backup weights (a copy:
                                          the backup rotation cannot take them away)
evaluator/inbox/epoch-000003.json         that epoch's training logs; written after the
                                          weights, so its presence says the entry is whole
evaluator/history.jsonl                   the evaluator's record, one line per epoch
evaluator/trained.json                    the chief: training ended after N epochs
evaluator/summary.json                    the evaluator: every epoch validated, the test
evaluator/alive                           touched by the evaluator every `BEAT_S` seconds
```

The chief writes `summary.json` once, whole: at its end it writes `trained.json`, waits (at
most `strategy.start_timeout_s`) for the evaluator's `summary.json`, and merges it into its
own (`merged`); an evaluator that died or is late leaves the summary saying validation was
incomplete. The chief stops waiting early for an evaluator that gave a sign of life once
and none for `STALE_S` seconds (it died); one that never did may yet start, late.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

from trainer.config.errors import ConfigError
from trainer.rundir.atomic import write_json, write_text
from trainer.rundir.layout import EvaluatorDir, RunDir
from trainer.rundir.lock import holder

_ENTRY = re.compile(r"epoch-(\d{6})\.json")
BEAT_S = 2.0  # how often the evaluator says it is alive
STALE_S = 30.0  # no sign of life for this long: it is gone


def gone_for(alive: Path, now: float) -> float | None:
    """Seconds since the evaluator's last sign of life (`alive`'s time); None: none yet."""
    try:
        return max(0.0, now - alive.stat().st_mtime)
    except OSError:
        return None


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
    """Writes every record, one JSON line each, whole (`write_text`)."""
    write_text(path, "".join(json.dumps(r) + "\n" for r in records))


def best_record(records: list[dict[str, Any]], monitor: str, mode: str) -> dict | None:
    """The record of the best epoch by `monitor` (the earliest of equals)."""
    best = None
    for record in records:
        value = record.get(monitor)
        if value is not None and improved(float(value), None if best is None
                                          else float(best[monitor]), mode):
            best = record
    return best


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
        found["validated_by"]["says"] = validated_line(found["validated_by"])
        return found
    history = dict(found.get("history") or {})
    history.update(result["history"])
    found.update(history=history, validation_metrics=result["validation_metrics"],
                 test_metrics=result["test_metrics"], test_checkpoint=result["test_checkpoint"])
    found["validated_by"] = {"task": "evaluator", "complete": bool(result["complete"]),
                             "epochs": result["epochs"], "best": result["best"],
                             "why": None if result["complete"] else
                             f"epochs {_missing(result)} were not validated"}
    found["validated_by"]["says"] = validated_line(found["validated_by"])
    return found


def done_line(trained: dict[str, Any], validated: set[int]) -> str:
    """What the evaluator says at its end: every epoch validated, or which epochs the chief
    never handed over (the summary then says validation was incomplete)."""
    gone = sorted(set(range(1, int(trained.get("epochs_done", 0)) + 1)) - set(validated))
    if not gone:
        return "done: validated every epoch and ran the final test"
    return (f"done: ran the final test; epoch{'s' if len(gone) > 1 else ''} "
            f"{', '.join(map(str, gone))} never came to be validated (the summary says so)")


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
                 poll_s: float = 0.5, stale_s: float = STALE_S
                 ) -> tuple[dict | None, str | None]:
    """The chief's end: says training ended (`trained.json`), then waits at most
    `timeout_s` (None: no limit) for the evaluator's result, less where the evaluator gave
    no sign of life for `stale_s` seconds.

    Returns:
        (result, None), or (None, why) where none came.
    """
    write_json(place.trained, {"epochs_done": epochs_done})
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while deadline is None or time.monotonic() < deadline:
        try:
            result = json.loads(place.summary.read_text())
        except (OSError, ValueError):
            result = None
        if result is not None and result.get("epochs_trained") == epochs_done:
            return result, None
        silent = gone_for(place.alive, time.time())
        if silent is not None and silent > stale_s:
            return None, f"the evaluator stopped (no sign of life for {silent:.0f} s)"
        time.sleep(poll_s)
    return None, (f"the evaluator gave no result within {timeout_s:g} s "
                  "(strategy.start_timeout_s) of the end of training")


def wait_for_run(run_dir: Path, timeout_s: float | None, poll_s: float) -> None:
    """The evaluator's start: waits for the chief to record the run's config (it does once
    its data is checked).

    Raises:
        ConfigError: none came within `timeout_s` (None: no limit).
    """
    config = RunDir(run_dir).config
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not config.is_file():
        if deadline is not None and time.monotonic() > deadline:
            raise ConfigError(f"the evaluator waited {timeout_s:g} s "
                              f"(strategy.start_timeout_s) for the chief to start a run in "
                              f"{run_dir}, which never wrote {config}; start the workers, or "
                              "give the evaluator the chief's hydra.run.dir")
        time.sleep(poll_s)


def chief_holds(run_dir: Path) -> bool:
    """Whether a process (the chief) holds the run directory's lock: the chief stopped
    without ending training once it held it and holds it no more."""
    return holder(run_dir) is not None


def read_trained(place: EvaluatorDir) -> dict[str, Any] | None:
    """What the chief said at the end of training (`trained.json`); None before."""
    try:
        return json.loads(place.trained.read_text())
    except (OSError, ValueError):
        return None
