"""The version bounds: pyproject's bounds, constraints.txt inside them, the installed set
inside them, and scripts/check_versions.py (its pure parts here; `--lowest` end to end in
the slow test, which installs TensorFlow into a scratch venv).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import tomllib
from conftest import REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

sys.path.insert(0, str(REPO / "scripts"))

import check_versions as cv  # noqa: E402

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SECTIONS = cv.requirements(PYPROJECT)
CONSTRAINTS = (REPO / "constraints.txt").read_text()
# Bounded both ways: the runtime dependencies and the extras a user installs (the sweep
# extra's plugins and the dev tools are pinned by constraints.txt only).
BOUNDED = [r for section in ("dependencies", "mlflow", "wandb", "onnx", "remote")
           for r in SECTIONS[section]]
# trainer reaches into these packages' internals: the next minor release may move them.
NEXT_MINOR = ("keras", "tensorflow", "tensorboard", "hydra-core")


def test_every_runtime_and_extra_dependency_has_a_lower_and_an_upper_bound():
    names = [canonicalize_name(r.name) for r in SECTIONS["dependencies"]]
    assert {"keras", "tensorflow", "tensorboard", "numpy", "hydra-core"} <= set(names)
    for requirement in BOUNDED:
        lower, upper = cv.bounds(requirement)
        assert lower and upper, f"{requirement}: needs >=lower,<upper"
        assert Version(lower) < Version(upper), requirement


def test_keras_tensorflow_and_hydra_stop_below_their_next_minor_release():
    for requirement in SECTIONS["dependencies"]:
        if canonicalize_name(requirement.name) in NEXT_MINOR:
            lower, upper = (Version(v) for v in cv.bounds(requirement))
            assert upper.micro == 0 and len(upper.release) == 2, requirement  # <3.16
            assert upper.major == lower.major and upper.minor > lower.minor, requirement


def test_the_installed_versions_are_inside_the_bounds():
    outside = []
    for requirement in BOUNDED:
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:  # an extra not installed here
            assert requirement not in SECTIONS["dependencies"]
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            outside.append(f"{requirement.name} {version} (wants {requirement.specifier})")
    assert outside == []


def test_constraints_pin_every_named_dependency_inside_its_bounds():
    pins = cv.read_constraints(CONSTRAINTS)
    wrong = []
    for section, found in SECTIONS.items():
        for requirement in found:
            pinned = pins.get(canonicalize_name(requirement.name))
            if pinned is None or not requirement.specifier.contains(pinned, prereleases=True):
                wrong.append(f"[{section}] {requirement} pinned {pinned}")
    assert wrong == [], "refresh constraints.txt (README, Versions) or move the bound"
    assert "trainer" not in pins


def test_constraints_is_what_pip_c_accepts():
    """Only name==version lines (pip's -c refuses extras, editables and URLs)."""
    lines = [line for line in CONSTRAINTS.splitlines() if line and not line.startswith("#")]
    assert len(lines) > 100  # the whole installed set, not the direct dependencies only
    assert all(" @ " not in line and "[" not in line and not line.startswith("-")
               for line in lines)
    assert cv.read_constraints(CONSTRAINTS)["keras"] == importlib.metadata.version("keras")


def test_the_refresh_command_writes_what_pip_c_accepts(tmp_path):
    """docs/versions.md's refresh, in this venv: every installed package but pip and the
    editable trainer, each name==version."""
    pip = Path(sys.executable).parent / "pip"
    command = f"{pip} freeze --all --exclude-editable | grep -v '^pip==' > constraints.txt"
    assert command.replace(str(pip), ".venv/bin/pip") in (
        REPO / "docs" / "versions.md").read_text()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user runs it
    subprocess.run(command, shell=True, check=True, cwd=tmp_path, env=env, timeout=120)
    pins = cv.read_constraints((tmp_path / "constraints.txt").read_text())
    assert "pip" not in pins and "trainer" not in pins
    assert pins["keras"] == importlib.metadata.version("keras")
    assert pins["setuptools"] == importlib.metadata.version("setuptools")


def test_ci_and_the_readme_install_with_the_constraints():
    assert ("uv pip install --quiet --compile-bytecode --python .venv/bin/python -e '.[dev]' "
            "-c constraints.txt") in (REPO / ".ci" / "run").read_text()
    assert "pip install -e '.[dev]' -c constraints.txt" in (REPO / "README.md").read_text()


# -- scripts/check_versions.py's pure parts -------------------------------------------------

def test_bounds_and_the_lowest_pins():
    assert cv.bounds(Requirement("keras>=3.10,<3.16")) == ("3.10", "3.16")
    assert cv.bounds(Requirement("wheel")) == (None, None)
    pins = cv.lowest_pins([Requirement("Keras>=3.10,<3.16"), Requirement("PyYAML>=6.0.1")])
    assert pins == {"keras": "3.10", "pyyaml": "6.0.1"}
    with pytest.raises(ValueError, match="numpy<3 has no lower bound"):
        cv.lowest_pins([Requirement("numpy<3")])
    runtime = cv.lowest_pins(SECTIONS["dependencies"])
    assert set(runtime) >= {"keras", "tensorflow"}


def test_constraints_and_pins_are_read_strictly():
    assert cv.read_constraints("# set\nKeras==3.15.1\n\ntyping_extensions==4.16.0  # why\n") \
        == {"keras": "3.15.1", "typing-extensions": "4.16.0"}
    for bad in ("-e .", "trainer[dev]==0.1", "numpy>=2"):
        with pytest.raises(ValueError, match="is not name==version"):
            cv.read_constraints(bad)
    assert cv.parse_pins(["Keras==3.12.0"]) == {"keras": "3.12.0"}
    with pytest.raises(ValueError, match="expected name==version"):
        cv.parse_pins(["keras>=3.12"])


TRACEBACK = """Traceback (most recent call last):
  File "{repo}/tests/test_loop.py", line 40, in test_x
    train(cfg)
  File "{repo}/trainer/run/train.py", line 10, in train
    step = make_step(model)
  File "{repo}/trainer/internals/keras_step.py", line 5, in make_step
    return TensorFlowTrainer.make_train_function(model)
  File "{repo}/trainer/internals/keras_step.py", line 9, in _wrapped
    helper()
  File "{repo}/trainer/run/assembly/step.py", line 3, in helper
    raise AttributeError("gone")
  File "/venv/lib/python3.11/site-packages/keras/src/trainers/trainer.py", line 1, in f
    pass
AttributeError: 'Model' object has no attribute '_compile_metrics'
"""


def test_a_failure_is_named_by_the_deepest_internals_function_it_came_through():
    text = TRACEBACK.format(repo=REPO)
    # deeper trainer frames (run.assembly.step.helper) lose to the deepest internals one
    assert cv.trainer_function(text, REPO / "trainer") == "internals.keras_step._wrapped"
    without = text.replace("trainer/internals/keras_step.py", "trainer/run/fit/loop.py")
    assert cv.trainer_function(without, REPO / "trainer") == "run.assembly.step.helper"
    # an installed trainer, a relative path, a chained exception's later block
    installed = text.replace(f"{REPO}/trainer/", "/v/lib/python3.11/site-packages/trainer/")
    assert cv.trainer_function(installed, REPO / "trainer") == "internals.keras_step._wrapped"
    relative = text.replace(f"{REPO}/", "")
    assert cv.trainer_function(relative, REPO / "trainer") == "internals.keras_step._wrapped"
    chained = (f'{text}\nDuring handling of the above exception, another exception occurred:'
               f'\n\nTraceback (most recent call last):\n  File "{REPO}/trainer/internals/'
               f'tracker.py", line 2, in state\n    x()\nKeyError: 1\n')
    assert cv.trainer_function(chained, REPO / "trainer") == "internals.tracker.state"
    assert cv.trainer_function(f'  File "{REPO}/tests/test_x.py", line 1, in test_x\n',
                               REPO / "trainer") is None
    # a repository that is itself called trainer: its tests/ are not the package
    assert cv.trainer_function('  File "/src/trainer/tests/t.py", line 1, in t\n',
                               REPO / "trainer") is None


def test_junit_failures_and_the_scoreboards_failures():
    xml = """<testsuites><testsuite>
      <testcase classname="tests.test_loop" name="test_a[fit]"/>
      <testcase classname="tests.test_loop" name="test_b"><failure message="AssertionError: x&#10;
more">Traceback ...</failure></testcase>
      <testcase classname="tests.test_parity" name="test_c"><error message="E">tb</error>
      </testcase>
      <testcase classname="tests.test_parity" name="test_d"><skipped message="no GPU"/>
      </testcase></testsuite></testsuites>"""
    ran, failed = cv.junit_failures(xml)
    assert ran == 3
    assert [(f["name"], f["message"]) for f in failed] == [
        ("tests/test_loop.py::test_b", "AssertionError: x"), ("tests/test_parity.py::test_c", "E")]
    board = {"header": ["scenario", "fit x1", "fit x2"],
             "rows": [["a", "pass", "differs: weights 1e-3"], ["b", "refused: why", "pass"],
                      ["c", "traceback: KeyError: 1", "differs: weights 2e-3"]],
             "tracebacks": [[None, None], ["tb0", None], ["tb1", None]]}
    failed = cv.scoreboard_failures(board, {("a", "fit x2"): "known"})
    assert [(f["name"], f["traceback"]) for f in failed] == [
        ("scoreboard c [fit x1]", "tb1"), ("scoreboard c [fit x2]", "")]


def test_the_contract_tests_known_differences_are_read_without_importing_it():
    known = cv.known_differences(REPO / "tests" / "test_keras_contract.py")
    assert ("own_train_step", "fit x2") in known and ("loss_scaling", "custom x2") in known
    assert all(isinstance(why, str) and why for why in known.values())


def test_the_table_names_each_failures_function():
    results = [{"set": "lowest", "versions": {"python": "3.11.7", "keras": "3.10.0",
                                             "numpy": "1.26.0", "tensorflow": "2.20.0"},
                "passed": 50, "failures": [
                    {"name": "tests/test_loop.py::test_b", "function": "internals.step.f"},
                    {"name": "pip install", "function": None}]}]
    assert cv.table(results).splitlines()[2] == (
        "| lowest | python 3.11.7, keras 3.10.0, tensorflow 2.20.0 | 50 | 2 | "
        "tests/test_loop.py::test_b: internals.step.f<br>pip install: (no trainer frame) |")


def test_the_script_refuses_bad_options_in_one_line():
    for args, said in ((["--lowest", "--pin", "keras>=3"], "expected name==version"),
                       ([], "say --lowest, --newest or both")):
        done = subprocess.run([sys.executable, str(REPO / "scripts" / "check_versions.py"),
                               *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and said in done.stderr.splitlines()[-1]


def _versions_line(stdout: str, mode: str) -> dict[str, str]:
    """{name: version} of the script's `MODE: python 3.11.7, keras 3.13.0, ...` line."""
    line = next(line for line in stdout.splitlines() if line.startswith(f"{mode}: python "))
    listed = line.split(": ", 1)[1].rsplit(" (installed", 1)[0]
    return dict(item.split(" ", 1) for item in listed.split(", "))


def test_the_lowest_bounds_pass_the_keras_contract_subset():
    """`check_versions.py --lowest`: a scratch venv with every runtime dependency at its
    lower bound (TensorFlow downloaded once, then from pip's cache), the contract subset
    there; exit 0, those versions installed, the table, the venv gone."""
    scratch = Path(tempfile.gettempdir())
    before = set(scratch.glob("trainer-versions-lowest-*"))
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "check_versions.py"),
                           "--lowest"], capture_output=True, text=True, timeout=5400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    installed = _versions_line(done.stdout, "lowest")
    for name, lower in cv.lowest_pins(SECTIONS["dependencies"]).items():
        assert Version(installed[name]) == Version(lower), name
    assert "| lowest | python " in done.stdout and "FAIL" not in done.stdout
    assert "kept:" not in done.stdout
    assert set(scratch.glob("trainer-versions-lowest-*")) == before


@pytest.mark.long
def test_the_scoreboard_driver_keeps_each_cells_traceback(tmp_path):
    """The scoreboard as `--newest` runs it, in this venv: two scenarios on one replica,
    every cell a pass with no traceback, in the JSON the failures are read from."""
    out = tmp_path / "board.json"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "check_versions.py"),
                           "--scoreboard-driver", str(out), "--scoreboard-columns", "fit:1",
                           "--scenarios", "single_output,own_train_step"],
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    board = json.loads(out.read_text())
    assert board["header"] == ["scenario", "fit x1"]
    assert board["rows"] == [["single_output", "pass"], ["own_train_step", "pass"]]
    assert board["tracebacks"] == [[None], [None]]
    assert cv.scoreboard_failures(board, {}) == []


def test_the_internals_rooms_tested_range_is_pyprojects():
    """The room warns outside the range pyproject.toml allows: its `TESTED` major.minor
    pairs are the bounds' (the lower one, and the one below the upper)."""
    from trainer.internals import TESTED

    for requirement in SECTIONS["dependencies"]:
        name = canonicalize_name(requirement.name)
        if name not in TESTED:
            continue
        lower, upper = (Version(v) for v in cv.bounds(requirement))
        newest = f"{upper.major}.{upper.minor - 1}"
        assert TESTED[name] == (f"{lower.major}.{lower.minor}", newest), name
