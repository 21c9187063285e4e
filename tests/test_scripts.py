"""Every script under scripts/ runs in its smallest mode, in a fresh process under a hard
timeout, to the lines that carry its result (the ratios a benchmark is run for): a script
that no longer imports, or whose numbers no longer come out, fails here, not on the day
someone runs it for a release note. The numbers themselves are not judged (a smoke run on a
shared machine measures nothing); the first test keeps the list whole.

The scripts that train in their own process on at most 2 logical CPUs (`TOGETHER`) run one
after another in one fresh process, each as `python scripts/NAME ARGS` runs it (its
`__main__` with its arguments, scripts/ importable), after the CPU is split in 2 as
`--devices 2` splits it: they share the start of Python and TensorFlow, and each is still
judged by its own lines in its own test. The others start processes of their own (or split
the CPU otherwise) and run alone.

Covered elsewhere, each in its smallest mode: `gpu_check.py` (tests/test_gpu_check.py, its
CPU dry run), `check_versions.py` (tests/test_versions.py, its scoreboard driver; an
install of TensorFlow is `-m slow`), `plain_keras_digits.py` (the plain side of
`bench_run.py`, below); `keras_scenarios.py` is the scenarios `keras_contract.py` imports.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import LANE_WAIT, REPO

# One training run per side at 64 examples, 2 epochs (the first, tracing, is never timed).
TINY_RUN = ["--pairs", "1", "--epochs", "2", "--examples", "64", "--per-replica", "8",
            "--model", "cnn", "--image-size", "8"]
# script -> (its smallest arguments, the lines its result is printed in)
SMOKE = {
    "bench_accumulate.py": ([*TINY_RUN, "--accumulate", "2"],
                            [r"median ratio accumulate=2 / accumulate=1 over 1 pairs: \d"]),
    "bench_augment.py": (TINY_RUN, [r"median ratio augmented / plain over 1 pairs: \d"]),
    # at the URL only: the disk side is the same runs without moto's server
    "bench_backup.py": ([*TINY_RUN, "--places", "url"],
                        [r"median ratio backup / none at an S3 URL \(moto, 127\.0\.0\.1\) over 1 "
                         r"pairs: \d.*accounted in the backup runs: the step loop in backups "
                         r"[\d.]+% of the timed time \+ the writer's CPU [\d.]+% of the cores' "
                         r"= 1\.\d"]),
    "bench_fingerprint.py": (["--images", "20", "--rounds", "1"],
                             [r"fingerprint, cold \(20 files hashed\) +[\d.]+ +[\d.]+%",
                              r"fingerprint, warm \(cache hits\) +[\d.]+ +[\d.]+%"]),
    "bench_input.py": (["--images", "16", "--batch", "8", "--pairs", "1", "--cached", "64",
                        "--cached-batch", "16"],
                       [r"median ratio trainer / naive \(as written\) over 1 pairs: \d",
                        r"median ratio trainer / naive \(literal\) over 1 pairs: \d",
                        r"median CPU ratio trainer / tutorial \(cached epochs\) over 2 "
                        r"pairs: \d"]),
    # a fresh process per side: it runs alone
    "bench_overhead.py": (TINY_RUN,
                          [r"^pair 1 \(plain then fit then custom\): plain +[\d.]+ ex/s "
                           r"\(epochs \d\.\d\d-\d\.\d\d\)",
                           r"median ratio trainer\[fit\] / plain over 1 pairs: \d",
                           r"median ratio trainer\[custom\] / plain over 1 pairs: \d",
                           r"median ratio trainer\[custom\] / trainer\[fit\]: \d",
                           r"^load average \(1, 5, 15 min\) before: [\d.]+, [\d.]+, [\d.]+; "
                           r"after: \d"]),
    "profile_step.py": (["--model", "cnn", "--image-size", "8", "--per-replica", "8",
                         "--blocks", "1", "--steps", "1"],
                        [r"^step \(full batches of a known size; 1 steps a block\): "
                         r"trainer / plain \d",
                         r"^step \(unknown static batch size; 1 steps a block\): "
                         r"trainer / plain \d",
                         r"^  the same blocks' CPU seconds .*: trainer / plain \d"]),
    "bench_precision.py": (["--rounds", "1", "--epochs", "2", "--examples", "64", "--batch",
                            "16", "--model", "cnn", "--image-size", "8"],
                           [r"median throughput ratio mixed_bfloat16 / float32: \d",
                            r"median throughput ratio float32\+xla / float32: \d"]),
    "bench_replicas.py": (["--replicas", "1,2", "--pairs", "1", "--global-batch", "16",
                           "--examples", "64", "--epochs", "2", "--model", "cnn",
                           "--image-size", "8"],
                          [r"^2 vs 1 replica\(s\): throughput plain \d"]),
    "bench_run.py": (["--pairs", "1", "--epochs", "1", "--no-startup"],
                     [r"median trainer / plain over 1 pairs: wall \d+\.\d+, CPU \d",
                      r"^start-up, median seconds: trainer's to train\(\) .* \d+\.\d+; the "
                      r"plain script's interpreter and `import keras, tensorflow` \d+\.\d+"]),
    # on 2 replicas (a column of its matrix): it then splits the CPU as the others do
    "keras_contract.py": (["--only", "single_output", "--columns", "fit:2"],
                          [r"^\| single_output \| pass \|$"]),
    "profile_first_step.py": (["--replicas", "1,2", "--global-batch", "16", "--steps", "1",
                               "--model", "cnn"],
                              [r"^2 vs 1: trace \d+\.\d+x, first call \d"]),
    "ulp_probe.py": (["--moves", "1"],
                     [r"^rerun from the same weights: 0\.0e\+00$",
                      r"^dense/kernel\[\d+, \d+\] moved by one last bit: \d"]),
}
# Run in one process, in this order (see the module's docstring). ulp_probe and
# keras_contract first: they compare runs bit for bit or to plain Keras, before any other
# script has changed Keras's state; bench_precision last: its mixed_bfloat16 runs set a
# precision policy.
TOGETHER = ("ulp_probe.py", "keras_contract.py", "bench_fingerprint.py", "bench_input.py",
            "bench_accumulate.py", "bench_augment.py", "bench_backup.py", "profile_step.py",
            "bench_precision.py")
# Each script as `python scripts/NAME ARGS` runs it, a line before and after each.
RUN_TOGETHER = """
import json
import runpy
import sys
import traceback

import tensorflow as tf

tf.config.set_logical_device_configuration(  # as `--devices 2` splits it, once, first
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
sys.path.insert(0, SCRIPTS)
for name, args in json.loads(sys.argv[1]):
    print(f"=== {name} begins", flush=True)
    print(f"=== {name} begins", file=sys.stderr, flush=True)
    sys.argv = [f"{SCRIPTS}/{name}", *args]
    code = 0
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except Exception:  # one script's failure is its own test's, not the others'
        traceback.print_exc()
        code = 1
    print(f"=== {name} exit {code}", flush=True)
    print(f"=== {name} exit {code}", file=sys.stderr, flush=True)
"""
# Started by another test, or not a script (see the module's docstring).
ELSEWHERE = {"gpu_check.py", "check_versions.py", "plain_keras_digits.py",
             "keras_scenarios.py"}
# Several worker processes: in the several-process run (`-m multiworker`), below.
WORKERS = ("bench_workers.py", ["--images", "30", "--side", "32", "--only", "control",
                                "--epochs", "2"],
           [r"^control +CPU 2 workers / 1 worker: \d+\.\d+"])


def run_script(name: str | list[str], args: list[str], tmp_path,
               timeout: float = 300 + LANE_WAIT):
    """`python scripts/NAME ARGS` (or `python NAME... ARGS` for a list) from a scratch
    folder, with this checkout importable (the timeout: `LANE_WAIT`'s)."""
    env = {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"},
           "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    command = name if isinstance(name, list) else [str(REPO / "scripts" / name)]
    return subprocess.run([sys.executable, *command, *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=timeout)


def assert_prints(out, patterns: list[str]) -> None:
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    for pattern in patterns:
        assert re.search(pattern, out.stdout, re.M), (pattern, out.stdout[-3000:])


def test_every_script_has_a_smoke_run():
    scripts = {path.name for path in (REPO / "scripts").glob("*.py")}
    assert scripts == {*SMOKE, *ELSEWHERE, WORKERS[0]}
    assert set(TOGETHER) <= set(SMOKE)


@pytest.fixture(scope="module")
def together(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """`TOGETHER` run in one fresh process: each script's exit code and its own output."""
    import json

    folder = tmp_path_factory.mktemp("scripts")
    code = RUN_TOGETHER.replace("SCRIPTS", repr(str(REPO / "scripts")))
    out = run_script(["-c", code, json.dumps([[n, SMOKE[n][0]] for n in TOGETHER])],
                     [], folder, timeout=900 + LANE_WAIT)
    found = {}
    for name in TOGETHER:
        parts = [re.search(rf"^=== {re.escape(name)} begins\n(.*?)^=== {re.escape(name)} "
                           rf"exit (\d+)$", text, re.M | re.S) for text in (out.stdout,
                                                                             out.stderr)]
        if parts[0] is None:  # the process ended before this script ended
            found[name] = subprocess.CompletedProcess([], out.returncode or 1, out.stdout,
                                                      out.stderr)
            continue
        stderr = out.stderr if parts[1] is None else parts[1].group(1)
        found[name] = subprocess.CompletedProcess([], int(parts[0].group(2)),
                                                  parts[0].group(1), stderr)
    return found


@pytest.mark.long  # a fresh process each, TensorFlow started: 5-30 s
@pytest.mark.parametrize("name", sorted(set(SMOKE) - set(TOGETHER)))
def test_a_script_runs_to_its_ratios_in_its_smallest_mode(name, tmp_path):
    args, patterns = SMOKE[name]
    assert_prints(run_script(name, args, tmp_path), patterns)


@pytest.mark.long  # one fresh process for all of them
@pytest.mark.xdist_group("test_scripts.together")  # the process is started once
@pytest.mark.parametrize("name", TOGETHER)
def test_a_script_sharing_a_process_runs_to_its_ratios_in_its_smallest_mode(name, together):
    assert_prints(together[name], SMOKE[name][1])


@pytest.mark.long
@pytest.mark.multiworker
def test_the_workers_bench_runs_to_its_ratio_in_its_smallest_mode(tmp_path):
    name, args, patterns = WORKERS
    assert_prints(run_script(name, args, tmp_path, timeout=600), patterns)
