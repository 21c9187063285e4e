"""Which export formats can be written here: a format's converter and runtime packages,
checked in the pre-flight (a decide module: no TensorFlow) so a missing one is refused before
training, not after it."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from trainer.config.errors import ConfigError

# What a format needs beyond TensorFlow, to convert and to run the check; the extra of the
# same name installs it.
PACKAGES = {"onnx": ("tf2onnx", "onnx", "onnxruntime")}


def installed(package: str) -> bool:
    """Whether a package can be imported (without importing it)."""
    return importlib.util.find_spec(package) is not None


def check_converters(formats: Sequence[str]) -> None:
    """Refuses, before training, an export format whose converter or runtime is missing.

    Args:
        formats: the export formats (`trainer.config.validate.export_formats`).

    Raises:
        ConfigError: naming the format, the missing packages and the extra to install.
    """
    for name in formats:
        missing = [package for package in PACKAGES.get(name, ()) if not installed(package)]
        if missing:
            rest = ",".join(f for f in formats if f != name)
            raise ConfigError(f"export {name} needs {', '.join(missing)}, not installed: "
                              f"pip install 'trainer[{name}]' (or drop it: export=[{rest}])")
