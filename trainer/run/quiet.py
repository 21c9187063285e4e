"""TensorFlow's start-up lines out of a normal run's output.

Importing TensorFlow and looking for GPUs prints C++ log lines straight to file descriptor 2,
before Python's logging exists: "All log messages before absl::InitializeLog() ...", "Could
not find cuda drivers", "failed call to cuInit: ... CUDA error" on every machine without a
GPU, and the CPU feature notice. None is something a user can act on, and the cuInit one
reads as a failure. `tensorflow_started` runs the import and the GPU lookup with descriptor 2
sent to a temporary file, then writes back every line that is not one of these known
notices, so anything unexpected still shows. `TRAINER_TF_LOGS=1` turns the filter off.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

SWITCH = "TRAINER_TF_LOGS"
# C++ log lines (`I0000 00:00:... file.cc:NN] ...`) from the files that print start-up notices.
NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
    r"STDERR"
    r"|[IWE]\d{4} [\d:.]+\s+\d+ (cudart_stub|cuda_platform|cuda_executor|cuda_diagnostics|"
    r"cuda_dnn|cuda_fft|cuda_blas|cpu_feature_guard|port|gpu_device|cpu_allocator_impl)"
    r"\.cc:\d+\] .*"
    r"|To enable the following instructions: .* in other operations, rebuild TensorFlow with "
    r"the appropriate compiler flags\.)$")


def is_noise(line: str) -> bool:
    """Whether a stderr line is one of TensorFlow's known start-up notices."""
    return bool(NOISE.match(line.rstrip("\n")))


@contextmanager
def _stderr_filtered() -> Iterator[None]:
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


def tensorflow_started() -> None:
    """Imports TensorFlow and lists the GPUs (where CUDA's notices come from), quietly."""
    if os.environ.get(SWITCH) == "1":
        return
    with _stderr_filtered():
        import tensorflow as tf

        tf.config.list_physical_devices("GPU")
