"""Sharded TFRecord files of `tf.train.Example`s: `dataset=tfrecord dataset.path=DIR`
(`reader`), and the writer of an image folder into that layout (`writer`; the command
`python -m trainer.data.tfrecords IMAGES OUT --shards N`, `__main__`).

The names (`load`, `write`, `main`, `DataError`, ...) load on first use, so the command
starts TensorFlow quietly before the modules that import it run. May import what `data/`
may.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {"load": "reader", "DataError": "reader", "IMAGE": "reader", "LABEL": "reader",
          "CLASSES": "reader", "COUNTS": "reader", "write": "writer", "main": "writer",
          "Written": "writer"}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"trainer.data.tfrecords.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'trainer.data.tfrecords' has no attribute {name!r}")
