"""`trainer.internals.tf_start._pump`, the line filter `cpp_notices_dropped` runs on
descriptor 2 where TensorFlow was imported before trainer: C++ INFO and WARNING records and
the start-up notices are dropped, everything else passes, a prompt without its newline at
once. (tests/test_fit_as_model_fit.py runs it on a script's stderr.)"""

from __future__ import annotations

import os
import threading

from trainer.internals import tf_start


def pumped(*writes: bytes) -> list[bytes]:
    """What reaches the target after each write (the pump in a thread, as in a run)."""
    source, sink = os.pipe()
    out_read, out_write = os.pipe()
    pump = threading.Thread(target=tf_start._pump, args=(source, out_write))
    pump.start()
    seen = []
    os.set_blocking(out_read, False)
    for data in writes:
        os.write(sink, data)
        pump.join(timeout=0.3)  # it keeps running; this only lets it copy
        try:
            seen.append(os.read(out_read, 65536))
        except BlockingIOError:
            seen.append(b"")
    os.close(sink)
    pump.join(timeout=5)
    assert not pump.is_alive()
    os.close(out_write)
    try:
        seen.append(os.read(out_read, 65536))
    except BlockingIOError:
        seen.append(b"")
    os.close(out_read)
    return seen


def test_cpp_info_and_warning_records_go_and_everything_else_passes_as_it_comes():
    seen = pumped(
        b"W0000 00:00:1796436012.195831   12806 dataset.cc:997] Input of GeneratorDatasetOp"
        b"::Dataset will not be optimized\n"
        b"I0000 00:00:1796436012.160837   12806 generator_dataset_op.cc:213] Memory patch\n"
        b"the script's own line\n",
        b"E0000 00:00:1796436012.1   12806 cuda_platform.cc:52] failed call to cuInit: "
        b"INTERNAL\n",  # the no-GPU notice
        b"E0000 00:00:1796436012.1   12806 ring_alg.cc:1] a real error\n",
        b"Continue? [y/N] ",  # a prompt: no newline, shown at once
        b"y\nlast words")
    assert seen[0] == b"the script's own line\n"
    assert seen[1] == b""
    assert seen[2] == b"E0000 00:00:1796436012.1   12806 ring_alg.cc:1] a real error\n"
    assert seen[3] == b"Continue? [y/N] "
    assert b"".join(seen[4:]) == b"y\nlast words"


def test_nothing_is_redirected_where_tensorflow_came_after_trainer(monkeypatch):
    monkeypatch.setattr(tf_start, "_LOUD", [])
    before = os.fstat(2)
    with tf_start.cpp_notices_dropped():
        assert os.fstat(2) == before
