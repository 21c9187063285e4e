"""`python -m trainer.data.tfrecords IMAGES OUT --shards N`: the writer
(`trainer.data.tfrecords.writer.main`), after TensorFlow started without its start-up notices
(`TRAINER_TF_LOGS=1` shows them), so the command prints its own lines alone."""

from __future__ import annotations

import os
import sys

from trainer.internals.tf_start import optional_parts_deferred, stderr_filtered


def cli(argv: list[str] | None = None) -> int:
    """Runs the writer's command; returns its exit code."""
    if os.environ.get("TRAINER_TF_LOGS") != "1":
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        with stderr_filtered(), optional_parts_deferred():
            import tensorflow as tf

            tf.config.list_physical_devices("GPU")
    from trainer.data.tfrecords.writer import main

    return main(argv)


if __name__ == "__main__":
    sys.exit(cli())
