"""Data sources (one module each) and the input pipeline they share.

A loader of the user's own returns a `Source` (`Source.from_arrays` for in-memory arrays).
"""

from trainer.data.pipeline import DataError, Source

__all__ = ["DataError", "Source"]
