"""The suite's own rules: at most 20 slow tests (the ones CI does not run), each listed with
why and how long; every id the lists name is a test that exists (a renamed test would
otherwise leave its list silently, and run where it should not)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import LONG_LIST, REPO, SLOW_LIST


def _collected(marks: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0",
                           "-m", marks, "-p", "no:randomly"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_each_slow_line_says_its_time_after_its_reason():
    lines = (REPO / "tests" / "slow_tests.txt").read_text().splitlines()
    for index, line in enumerate(lines):
        if line.strip() and not line.startswith("#"):
            assert re.search(r"  # ~?\d+\+?$", line), line  # its seconds
            reason = next(lines[i] for i in range(index - 1, -1, -1)
                          if not lines[i].startswith("tests/"))
            assert reason.startswith("# "), line  # the comment above its group says why


@pytest.mark.long  # collects the whole suite twice in fresh processes
def test_at_most_20_slow_tests_and_every_listed_id_exists():
    every = set(_collected(""))
    assert SLOW_LIST <= every, sorted(SLOW_LIST - every)
    assert LONG_LIST <= every, sorted(LONG_LIST - every)
    slow = _collected("slow")
    assert len(slow) <= 20, slow
