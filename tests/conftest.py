"""Shared test setup: 4 logical CPU devices, and configs composed from the real conf/."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
# One thread per kernel: two test processes share 2 cores, and the tiny models here gain
# nothing from splitting a kernel; kernel threads of both processes only preempted each other
# (the suite ran about 7% faster, and used 10% less CPU). Set in the environment, so the
# subprocesses the tests start do the same.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
# The image folders' hash cache (trainer.data.fingerprint): the session's own, not the user's.
if "TRAINER_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["TRAINER_CACHE_DIR"] = tempfile.mkdtemp(prefix="trainer-test-cache-")
    atexit.register(shutil.rmtree, os.environ["TRAINER_CACHE_DIR"], True)

import pytest  # noqa: E402

from trainer.internals.tf_start import optional_parts_deferred, stderr_filtered  # noqa: E402

# As a run imports them (Keras's scikit-learn wrappers and image gallery on first use), with
# the garbage collector paused until they are frozen below (trainer.run.process's
# `collector_paused`: a second of CPU less in each test process's start).
# TensorFlow's start-up notices ("failed call to cuInit" on every machine without a GPU)
# filtered as a run filters them (`stderr_filtered`): else pytest prints them after its
# summary.
gc.disable()
with stderr_filtered(), optional_parts_deferred():
    import tensorflow as tf  # noqa: E402

    # Listing physical devices does not start TensorFlow's runtime, so the split below still
    # works.
    GPUS = tf.config.list_physical_devices("GPU")
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.config_store import ConfigStore  # noqa: E402

from trainer.config.schema import config_dir, register_configs  # noqa: E402
from trainer.internals.tf_runtime import onednn_enabled  # noqa: E402

# oneDNN's CPU kernels: on by default where the CPU has AVX-512 VNNI, BF16 or AMX, and fixed
# as TensorFlow starts. This process started with the host's default (or the variable CI
# exports); stating it in the environment gives every process a test starts the same kernels,
# so `deterministic=true` (which turns them off only where the variable is unset) cannot run
# one side of an exactness comparison on other kernels than its in-process other side.
# Tests of that switch itself remove the variable from their children's environment.
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if onednn_enabled() else "0"

# The runtime started below would otherwise reserve nearly all of every GPU's memory in this
# process, leaving none to the subprocesses the gpu-marked tests start.
for _gpu in GPUS:
    tf.config.experimental.set_memory_growth(_gpu, True)

# Devices can be split only before TensorFlow's runtime starts: once, here, for the session.
LOGICAL_CPUS = 4
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * LOGICAL_CPUS)
# Start the runtime now, so no test can re-split the devices the others rely on.
assert len(tf.config.list_logical_devices("CPU")) == LOGICAL_CPUS
register_configs()
# `model=small` (tests/small_model.py) for this process's compositions: see tiny_config.
ConfigStore.instance().store(group="model", name="small",
                             node={"_target_": "small_model.build", "dropout": 0.25})
# Each in-process run leaves TensorFlow and Keras objects behind; Python's full collections
# then walk millions of them (a pure-AST test once took 145 s after others had trained in
# the same process). What exists after these imports never needs collecting, and full
# collections may come less often.
gc.freeze()
gc.enable()
gc.set_threshold(50_000, 20, 50)

REPO = Path(__file__).resolve().parent.parent
# Small and fast: 8x8 digits (no resize), one epoch, no progress bar.
TINY = ["epochs=1", "verbose=0", "dataset.image_size=8", "logger=[]"]
NO_GPU = "needs a GPU: none visible to TensorFlow"
# CI (.ci/run) runs the scripts' long tests (tests/test_scripts.py, tests/test_gpu_check.py) at
# the lowest CPU priority (nice 19) beside the several-process tests, on the cycles those leave
# idle: a subprocess there may get almost no CPU until that pass ends (9-11 minutes on 2 cores).
# Their wall timeouts add this wait, so that a timeout catches a hang, never a wait (a smoke
# run's 300 s once ran out while it waited).
LANE_WAIT = 900



def _listed(name: str) -> set[str]:
    """The test ids a list file names, one a line (`#` starts a comment)."""
    lines = (Path(__file__).parent / name).read_text().splitlines()
    return {line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()}


# The slow run (at most 20 tests, each with why it cannot be cheaper) and the long tests CI
# runs in a pass of its own, by their measured time (each file says how to refresh it).
SLOW_LIST = _listed("slow_tests.txt")
LONG_LIST = _listed("long_tests.txt")
# The exactness tests, run with oneDNN's kernels on and off (the file says how).
EXACT_LIST = _listed("exact_tests.txt")

# Module-scoped fixtures that each make a training run (or build a wheel, or start Ray's
# local cluster: its tests then run one after another, never two clusters at once). A test
# with several takes the first one's group.
SHARED_FIXTURES = ("cluster", "image_run", "finished_run", "finished", "wheel",
                   "uninterrupted")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Skips the gpu-marked tests where TensorFlow sees no GPU, saying so. Tests that share
    a module-scoped fixture run in one test process (`--dist loadgroup`), so its run is made
    once, not once per process; the others are spread one by one. The tests
    `slow_tests.txt` lists are marked slow, those `long_tests.txt` lists long, and those
    `exact_tests.txt` lists exact."""
    for item in items:
        if item.nodeid in SLOW_LIST:
            item.add_marker(pytest.mark.slow)
        if item.nodeid in LONG_LIST:
            item.add_marker(pytest.mark.long)
        if item.nodeid.split("[", 1)[0] in EXACT_LIST or item.nodeid in EXACT_LIST:
            item.add_marker(pytest.mark.exact)
        for name in SHARED_FIXTURES:
            if name in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(f"{item.module.__name__}.{name}"))
        if not GPUS and item.get_closest_marker("gpu") is not None:
            item.add_marker(pytest.mark.skip(reason=NO_GPU))


def make_config(*overrides: str):
    """Composes conf/config.yaml with overrides, as the command line would."""
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.fixture
def make_run():
    """Composes a config from overrides only (no shrinking)."""
    return make_config


def _chooses_model(override: str) -> bool:
    key = override.split("=", 1)[0].lstrip("+~")
    return key in ("model", "experiment") or key.startswith("model._target_")


@pytest.fixture
def tiny_config():
    """A composed config that trains in seconds; extra overrides are appended. The model is
    `model=small` (tests/small_model.py, half the cost of the default network's run) unless
    an override chooses one (`model=cnn` for the default network)."""
    def compose_tiny(*overrides: str):
        small = [] if any(map(_chooses_model, overrides)) else ["model=small"]
        return make_config(*TINY, *small, *overrides)
    return compose_tiny


def run_cli(*args: str, cwd: Path, timeout: float = 300, env: dict | None = None):
    """Runs `python -m trainer ARGS` in a subprocess with a hard timeout."""
    full_env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    full_env.update({"TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def _detach_handlers() -> None:
    import logging

    logging._handlers.clear()
    del logging._handlerList[:]


def run_main(*args: str, cwd: Path, timeout: float = 300):
    """`python -m trainer ARGS` as `run_cli` runs it, but in this process, the Hydra job
    included (a subprocess spends about 8 s starting Python and TensorFlow). The test
    session's TensorFlow already has 4 logical CPUs, so `accelerator=cpu devices=N` (N <= 4)
    runs as it would in a fresh process. What a fresh process alone shows (TensorFlow's
    start-up lines, a signal's exit) is tested with `run_cli`. `timeout` is unused (kept so
    the two are interchangeable).

    Returns:
        A `subprocess.CompletedProcess` with the exit code, stdout and stderr.
    """
    import contextlib
    import io
    import logging
    import logging.config

    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    import trainer.__main__ as entry

    del timeout
    out, err = io.StringIO(), io.StringIO()
    saved = (list(sys.argv), os.getcwd(), os.environ.get("HYDRA_FULL_ERROR"), list(sys.path))
    loggers = {name: (logger.handlers[:], logger.level, logger.propagate)
               for name, logger in [("", logging.getLogger()),
                                    *logging.Logger.manager.loggerDict.items()]
               if isinstance(logger, logging.Logger)}
    code = 0
    clear_handlers = logging.config._clearExistingHandlers
    # Hydra's job configures logging with dictConfig, which would close every handler of the
    # process, pytest's capture too: here it only detaches them (put back below).
    logging.config._clearExistingHandlers = _detach_handlers
    try:
        os.chdir(cwd)
        sys.argv = ["trainer", *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                entry.main()
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        sys.argv, cwd_before, full_error, sys.path[:] = saved
        os.chdir(cwd_before)
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error
        # Hydra's job configured logging (a console handler on the captured streams, a file
        # in the run directory): put every logger back as it was.
        for name, logger in [("", logging.getLogger()),
                             *logging.Logger.manager.loggerDict.items()]:
            if not isinstance(logger, logging.Logger):
                continue
            handlers, level, propagate = loggers.get(name, ([], logging.NOTSET, True))
            for handler in logger.handlers[:]:
                if handler not in handlers:
                    logger.removeHandler(handler)
                    handler.close()
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate
            logger.disabled = False
        logging.config._clearExistingHandlers = clear_handlers
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None  # train() without run_dir must not find this job's
    return subprocess.CompletedProcess(["trainer", *args], code, out.getvalue(), err.getvalue())


def error_lines(stderr: str) -> list[str]:
    """stderr without TensorFlow's C++ start-up lines, which no Python code can silence."""
    noise = ("I0000", "W0000", "E0000", "WARNING: All log messages before absl")
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith(noise)]

