"""The model builder given to `trainer.fit(model=...)` as a Python object (a function
defined in a notebook's `__main__`, a lambda): `model._target_=trainer.models.given.build`
names it in the config, and `trainer.config.given` holds it for the call.

`trainer.task.build.build_model` calls the object itself, with what its signature takes
(`input_shape`, `num_classes`, ... as for any builder); `build` is the same call for a
config instantiated by other means.
"""

from __future__ import annotations

from typing import Any

from trainer.config.given import lookup


def build(given: str | None = None, **options: Any) -> Any:
    """The given model builder called with `options`; `given` says what it was, for the
    message when it is missing (`trainer.config.given.lookup`)."""
    return lookup("model", given)(**options)
