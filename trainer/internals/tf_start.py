"""TensorFlow's start-up notices: C++ log lines its import and GPU lookup write straight to
file descriptor 2, before Python's logging exists ("All log messages before
absl::InitializeLog() ...", "Could not find cuda drivers", "failed call to cuInit: ... CUDA
error" on every machine without a GPU, the CPU feature and oneDNN notices). None is
something a user can act on, and `TF_CPP_MIN_LOG_LEVEL` does not silence them. Written for
TensorFlow 2.19-2.21 (`TESTED`), whose files and wording the pattern names.

`stderr_filtered` runs a block with descriptor 2 sent to a temporary file, then writes back
every line that is not one of these notices, so anything unexpected still shows. No
TensorFlow import here: the command that starts TensorFlow decides when.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

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
