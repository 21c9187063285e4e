"""The suite's own rules: at most 20 slow tests (the ones CI does not run), each listed with
why and how long; every id the lists name is a test that exists (a renamed test would
otherwise leave its list silently, and run where it should not)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import LONG_LIST, REPO, SLOW_LIST

# One collection of the whole suite, each id printed after "slow " where it is marked slow
# (by its decorator or by the slow list, as pytest_collection_modifyitems marks it).
_COLLECT = """
import sys

import pytest


class Marks:
    def pytest_collection_finish(self, session):
        for item in session.items:
            print(("slow " if item.get_closest_marker("slow") else "every ") + item.nodeid)


sys.exit(pytest.main(["--collect-only", "-q", "-n", "0", "-m", "", "-p", "no:randomly"],
                     plugins=[Marks()]))
"""


def _collected() -> tuple[set[str], list[str]]:
    """(every test's id, the ids marked slow), from one collection in a fresh process."""
    done = subprocess.run([sys.executable, "-c", _COLLECT], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    marked = [line.split(" ", 1) for line in done.stdout.splitlines()
              if line.startswith(("slow tests/", "every tests/"))]
    return {test for _, test in marked}, [test for mark, test in marked if mark == "slow"]


def test_each_slow_line_says_its_time_after_its_reason():
    lines = (REPO / "tests" / "slow_tests.txt").read_text().splitlines()
    for index, line in enumerate(lines):
        if line.strip() and not line.startswith("#"):
            assert re.search(r"  # ~?\d+\+?$", line), line  # its seconds
            reason = next(lines[i] for i in range(index - 1, -1, -1)
                          if not lines[i].startswith("tests/"))
            assert reason.startswith("# "), line  # the comment above its group says why


@pytest.mark.long  # collects the whole suite in a fresh process
def test_at_most_20_slow_tests_and_every_listed_id_exists():
    every, slow = _collected()
    assert SLOW_LIST <= every, sorted(SLOW_LIST - every)
    assert LONG_LIST <= every, sorted(LONG_LIST - every)
    assert slow and len(slow) <= 20, slow


# A module-scoped fixture shared by a group of tests, marked as tests/conftest.py marks them.
_GROUPED = """
import os

import pytest


@pytest.fixture(scope="module")
def shared():
    with open(os.environ["LOG"], "a") as log:
        log.write(f"made {os.getpid()}\\n")


@pytest.mark.parametrize("n", range(3))
def test_alone(n):
    pass


@pytest.mark.parametrize("n", range(6))
def test_together(n, shared):
    with open(os.environ["LOG"], "a") as log:
        log.write(f"ran {os.getpid()}\\n")
"""
_MARKS = """
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "shared" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("grouped.shared"))
"""


def test_tests_sharing_a_run_go_to_one_test_process(tmp_path):
    """`--dist loadgroup` (pyproject's addopts) keeps a group's tests in one test process, so
    its shared run is made once: pytest 9.2 with pytest-xdist 3.8 silently spread them (both
    processes made each shared run)."""
    (tmp_path / "test_grouped.py").write_text(_GROUPED)
    (tmp_path / "conftest.py").write_text(_MARKS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    log = tmp_path / "log"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist",
                           "loadgroup", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env={**os.environ, "LOG": str(log)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = log.read_text().split()
    assert lines.count("made") == 1 and lines.count("ran") == 6, lines
    assert len(set(lines[1::2])) == 1, lines  # one process made the run and ran every test
