"""TensorFlow's start-up notices: C++ log lines its import and GPU lookup write straight to
file descriptor 2, before Python's logging exists ("All log messages before
absl::InitializeLog() ...", "Could not find cuda drivers", "failed call to cuInit: ... CUDA
error" on every machine without a GPU, the CPU feature and oneDNN notices). None is
something a user can act on, and `TF_CPP_MIN_LOG_LEVEL` does not silence them. Written for
TensorFlow 2.19-2.21 (`TESTED`), whose files and wording the pattern names.

`stderr_filtered` runs a block with descriptor 2 sent to a temporary file, then writes back
every line that is not one of these notices, so anything unexpected still shows. No
TensorFlow import here: the command that starts TensorFlow decides when.

`quiet_when_imported` (called by `import trainer`) does the same for a user's script that
imports TensorFlow itself after trainer (`import trainer; import tensorflow as tf`): the
first import of `tensorflow` runs inside `stderr_filtered`, and TensorFlow's C++ INFO and
WARNING lines are left out (`TF_CPP_MIN_LOG_LEVEL=2` unless set). A script that imported
TensorFlow before trainer (`import keras` first) keeps what TensorFlow printed then, and its
TensorFlow reads `TF_CPP_MIN_LOG_LEVEL` once, at that import: `imported_loud` says so, and
`trainer.fit` then runs inside `cpp_notices_dropped`, which drops those INFO and WARNING
lines as they arrive (what the level would have), passing every other line on at once.
`TRAINER_TF_LOGS=1` shows everything.

`optional_parts_deferred` runs that import with two of Keras's public modules loaded on first
use rather than at import: `keras.wrappers` (its scikit-learn wrappers import scikit-learn and
SciPy's statistics) and `keras.visualization` (it imports `matplotlib.pyplot`). Keras imports
both at `import keras`, whether a program uses them or not: about a third of the CPU time of
`import tensorflow, keras` (3.5 s -> 2.4 s on these 2 cores), paid by every process trainer
starts (a run, a sweep's job, each worker). Used, they load as before: `keras.wrappers.
SKLearnClassifier` is Keras's own class.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SWITCH = "TRAINER_TF_LOGS"  # =1: every line TensorFlow writes is shown

# C++ log lines (`I0000 00:00:... file.cc:NN] ...`) from the files that print start-up notices.
NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
    r"STDERR"
    r"|[IWE]\d{4} [\d:.]+\s+\d+ (cudart_stub|cuda_platform|cuda_executor|cuda_diagnostics|"
    r"cuda_dnn|cuda_fft|cuda_blas|cpu_feature_guard|port|gpu_device|cpu_allocator_impl)"
    r"\.cc:\d+\] .*"
    r"|To enable the following instructions: .* in other operations, rebuild TensorFlow with "
    r"the appropriate compiler flags\.)$")


# What a worker's TensorFlow writes when a peer of its cluster is lost: the collective's and
# the coordination service's C++ error records, each followed by lines of the status it
# carries (the peer's name, gRPC's detail). The worker's own line names the peer and says
# how to resume; these ask nothing more of the user.
PEER_LOSS = re.compile(
    r"^[EW]\d{4} [\d:.]+\s+\d+ (ring_alg|base_collective_executor|coordination_service_agent|"
    r"coordination_service|collective_rma_distributed|collective_param_resolver_distributed|"
    r"hierarchical_tree_broadcaster|permuter)\.cc:\d+\] ")
PEER_LOSS_CONTINUED = re.compile(
    r"^(Additional GRPC error information from remote target "
    r"|:[A-Z_]+:Error received from peer "
    r"|/job:\w+/replica:\d+/task:\d+$"
    r"|The tasks have crashed\. "
    r"|The error could be from a previous operation\. )")


class PeerLossLines:
    """Tells a worker's lines about a lost peer (`PEER_LOSS` records and the status lines
    that continue them) from the rest, line by line, as they arrive."""

    def __init__(self) -> None:
        self._in_record = False

    def is_noise(self, line: str) -> bool:
        """Whether `line` is part of a peer-loss record."""
        line = line.rstrip("\n")
        if PEER_LOSS.match(line):
            self._in_record = True
        elif not (self._in_record and PEER_LOSS_CONTINUED.match(line)):
            self._in_record = False
        return self._in_record


def is_noise(line: str) -> bool:
    """Whether a stderr line is one of TensorFlow's known start-up notices."""
    return bool(NOISE.match(line.rstrip("\n")))


@contextmanager
def stderr_filtered() -> Iterator[None]:
    """Runs the block with descriptor 2 captured; writes back the lines that are not
    TensorFlow's start-up notices."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode("utf-8", errors="replace")
            kept = [line for line in text.splitlines() if line.strip() and not is_noise(line)]
            if kept:
                print("\n".join(kept), file=sys.stderr, flush=True)


# Keras's modules that `import keras` loads and a training run never uses, each with the heavy
# import it brings (Keras 3.13-3.15): loaded when first used instead.
DEFERRED = ("keras.wrappers",  # scikit-learn, SciPy's statistics
            "keras.src.wrappers",
            "keras.visualization",  # matplotlib.pyplot
            "keras.src.visualization")


class _OnFirstUse(importlib.abc.Loader):
    """Runs a module when one of its names is first read, not when it is imported. Unlike the
    standard library's `LazyLoader`, which runs it on any attribute read, the module's own
    attributes (`__file__`, `__path__`, `__spec__`) do not: `inspect.getmodule` reads
    `__file__` of every module in `sys.modules`, and TensorFlow's tracing calls it."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        lock, started = threading.RLock(), []

        def __getattr__(name: str) -> Any:  # noqa: N807 - a module's own (PEP 562)
            with lock:
                if not started:
                    started.append(True)
                    try:
                        self.loader.exec_module(module)
                    finally:
                        if module.__dict__.get("__getattr__") is __getattr__:
                            del module.__getattr__
            if module.__dict__.get("__getattr__") is __getattr__:  # read while it runs
                raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
            return getattr(module, name)

        module.__getattr__ = __getattr__


class _Deferring(importlib.abc.MetaPathFinder):
    """Finds the `DEFERRED` modules as Python's path finder does, with a loader that runs
    each on first use (`_OnFirstUse`)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in DEFERRED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _OnFirstUse(spec.loader)
        return spec


@contextmanager
def optional_parts_deferred() -> Iterator[None]:
    """Runs the block (the import of TensorFlow and Keras) with `DEFERRED` loaded on first
    use. A module imported before the block is left as it is."""
    finder = _Deferring()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


class _Quieted(importlib.abc.Loader):
    """Runs a module (the `tensorflow` package, and what its import brings) inside
    `stderr_filtered`."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        with stderr_filtered():
            self.loader.exec_module(module)


class _QuietTensorFlow(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` as Python's path finder does, with its import quieted
    (`_Quieted`); leaves `sys.meta_path` once it has found it."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "tensorflow":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Quieted(spec.loader)
        return spec


# Set by `quiet_when_imported`: TensorFlow was imported before trainer, with no
# `TF_CPP_MIN_LOG_LEVEL` (its C++ INFO and WARNING lines are on for the process's life).
_LOUD: list[bool] = []
# A C++ log record's first line: severity, date, time, thread, file:line.
CPP_RECORD = re.compile(rb"^([IWEF])\d{4} [\d:.]+\s+\d+ \S+:\d+\] ")


def imported_loud() -> bool:
    """Whether TensorFlow was imported before trainer with its C++ notices on (see the
    module's doc)."""
    return bool(_LOUD)


def quiet_when_imported() -> None:
    """Makes a later first `import tensorflow` in this process quiet (see the module's doc);
    nothing where TensorFlow is imported already (noted, where its C++ notices are on), or
    `TRAINER_TF_LOGS=1`. Idempotent."""
    if os.environ.get(SWITCH) == "1":
        return
    if "tensorflow" in sys.modules:
        if "TF_CPP_MIN_LOG_LEVEL" not in os.environ and not _LOUD:
            _LOUD.append(True)
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not any(isinstance(finder, _QuietTensorFlow) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlow())


def _kept(line: bytes) -> bool:
    """Whether a line of descriptor 2 is shown: all but C++ INFO and WARNING records and the
    start-up notices."""
    found = CPP_RECORD.match(line)
    if found is not None and found.group(1) in (b"I", b"W"):
        return False
    return not is_noise(line.decode("utf-8", errors="replace"))


def _pump(source: int, target: int) -> None:
    """Copies `source` to `target` line by line, without the lines `_kept` drops; a line's
    start that cannot be a C++ record goes on before its end arrives (a prompt)."""
    pending = b""
    while True:
        try:
            chunk = os.read(source, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        out = b"".join(line + b"\n" for line in lines if _kept(line))
        if pending and not re.match(rb"^[IWEF]\d{0,4}( |$)", pending[:6]):
            out, pending = out + pending, b""
        if out:
            os.write(target, out)
    if pending and _kept(pending):
        os.write(target, pending)
    os.close(source)


@contextmanager
def cpp_notices_dropped() -> Iterator[None]:
    """Runs the block with descriptor 2 read by a thread that drops TensorFlow's C++ INFO
    and WARNING lines (and the start-up notices) as they arrive and passes every other line
    on at once: `TF_CPP_MIN_LOG_LEVEL=2` for a TensorFlow that read its level before it was
    set. Nothing where `imported_loud` is false."""
    if not imported_loud():
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    source, sink = os.pipe()
    pump = threading.Thread(target=_pump, args=(source, saved), daemon=True,
                            name="trainer-stderr")
    os.dup2(sink, 2)
    os.close(sink)
    pump.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer closes: the thread drains it and ends
        pump.join(timeout=5.0)  # a process started in the block may still hold the pipe
        if not pump.is_alive():
            os.close(saved)
