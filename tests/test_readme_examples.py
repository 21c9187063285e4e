"""The README's own-task examples, extracted verbatim and run as a user would run them, and
the documented commands that need nothing but themselves.

Each `<!-- example: NAME.py -->` block is written into a fresh project directory and each
`<!-- example: NAME.sh -->` block is run there (shortened to 3 epochs, quiet, on logical
CPU devices; the command line's whole path, in the test process), so the documented examples
are the tested ones. `test_a_documented_command_runs` runs each command tests/test_docs.py
maps to it, as written, shortened to one quiet epoch.
"""

from __future__ import annotations

import json
import re
import shlex

import numpy as np
import pytest

from tests.conftest import REPO, error_lines, run_main
from tests.test_docs import RUNS_AS_WRITTEN, TESTED_BY


def examples() -> dict[str, str]:
    text = (REPO / "README.md").read_text()
    return dict(re.findall(r"<!-- example: (\S+) -->\n```\w*\n(.*?)```", text, re.S))


def test_the_readme_has_both_examples():
    assert {"wine.py", "wine.sh", "shop.py", "shop.sh"} <= set(examples())


def run_example(name: str, tmp_path) -> dict:
    blocks = examples()
    for file, body in blocks.items():
        if file.endswith(".py"):
            (tmp_path / file).write_text(body)
    command = shlex.split(blocks[f"{name}.sh"].replace("\\\n", " "))
    assert command[:3] == ["python", "-m", "trainer"]
    run_dir = tmp_path / f"run-{name}"
    out = run_main(*command[3:], "accelerator=cpu", "epochs=3", "verbose=0", "logger=[]",
                  f"hydra.run.dir={run_dir}", cwd=tmp_path, timeout=300)
    assert out.returncode == 0 and error_lines(out.stderr) == [], out.stderr[-3000:]
    return json.loads((run_dir / "summary.json").read_text())


def test_own_classification_example_trains_on_two_replicas(tmp_path):
    summary = run_example("wine", tmp_path)
    assert summary["replicas"] == 2 and summary["test_examples"] == 36
    assert summary["validation_metrics"]["accuracy"] > 0.8
    assert summary["test_metrics"]["accuracy"] > 0.7


def test_two_input_two_output_example_beats_trivial_answers(tmp_path):
    summary = run_example("shop", tmp_path)
    logged = summary["validation_metrics"]
    assert summary["train_examples"] == 500 and summary["validation_examples"] == 100
    assert logged["label_accuracy"] > 0.75  # the commoner class: 0.59
    rng = np.random.default_rng(0)
    num, cat = rng.normal(size=(600, 4)), rng.integers(0, 5, size=(600, 1))
    score = (2 * num[:, 1] + cat[:, 0])[500:]
    assert logged["score_mae"] < np.mean(np.abs(score - np.median(score))) / 2
    best = json.loads((tmp_path / "run-shop" / "checkpoints" / "best.keras.best.json")
                      .read_text())
    assert best["monitor"] == "val_label_accuracy"


AS_WRITTEN = sorted(command for command, test in TESTED_BY.items() if test == RUNS_AS_WRITTEN)
# keras.applications networks on 2 replicas: 30 s and more each, with the long tests
HEAVY = {command for command in AS_WRITTEN if "model=keras_app" in command}


@pytest.mark.parametrize("command", [
    pytest.param(c, marks=pytest.mark.long) if c in HEAVY else c for c in AS_WRITTEN],
    ids=lambda command: re.sub(r"\W+", "_", command.removeprefix("python -m trainer"))[:60]
    or "default")
def test_a_documented_command_runs(tmp_path, command):
    """A command of the README or docs/ as written (one epoch, quiet), from an empty folder
    and with no `hydra.run.dir`, as a user types it: its run is one folder under outputs/,
    the one the summary printed."""
    args = shlex.split(command)
    assert args[:3] == ["python", "-m", "trainer"]
    quiet = [] if any(a.startswith("logger=") for a in args) else ["logger=[]"]
    out = run_main(*args[3:], "epochs=1", "verbose=0", *quiet, cwd=tmp_path)
    assert out.returncode == 0 and error_lines(out.stderr) == [], out.stderr[-3000:]
    [run_dir] = [p.parent for p in (tmp_path / "outputs").rglob(".hydra")]
    assert re.search(rf"run directory +{run_dir.relative_to(tmp_path)}\n", out.stdout)
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs_done"] == 1 and "Summary" in out.stdout
