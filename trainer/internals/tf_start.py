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
