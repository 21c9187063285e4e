"""trainer's version: a leaf module (it imports nothing), so any floor may read it."""

__version__ = "0.1.0"
