"""Data: sources (one module each), the input pipeline they share, and augmentation.

A loader of the user's own returns a `Source` (`Source.from_arrays` for in-memory arrays).
May import `config/`, `plan/`, `rundir/` (the run directory's layout: a disk cache's files)
and `distribute/` (how a worker's share of the input is handed to the strategy). `Source`
and `DataError` are loaded on first use, so the pre-flight can check augmentation presets
(`data.augment`) without importing TensorFlow.
"""

from typing import Any

__all__ = ["DataError", "Source"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        # lazy: the pipeline imports TensorFlow (see the docstring)
        from trainer.data import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'trainer.data' has no attribute {name!r}")
