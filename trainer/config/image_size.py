"""The image side a run trains at: the dataset's own, raised to the model's smallest input.

A model YAML states the smallest image side it takes (`min_image_size: 32` for MobileNetV2;
none for the cnn, which takes any). The built-in image datasets write their own side through
the `trainer.image_size` resolver (`image_size: ${trainer.image_size:8}`), which gives that
side, or the model's minimum where that is larger: `model=mobilenet` trains on the 8x8 digits
at 32x32 with no override, and `--cfg job --resolve` shows it. A `dataset.image_size` given on
the command line replaces the interpolation; one below the model's minimum is refused before
TensorFlow starts (`check_image_size`). A model that resizes its inputs itself
(`model.input_size` of `keras_app`) takes any side.

Registered with the configs (`trainer.config.schema.register_configs`), so the command line,
the Python API and the tests' compositions all resolve it.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer.config.errors import ConfigError

RESOLVER = "trainer.image_size"


def model_minimum(model: Any) -> int | None:
    """The smallest image side a model node takes from the dataset; None: any.

    `model.min_image_size`, unless `model.input_size` is set: such a model resizes the
    images itself, to a side of its own.
    """
    if not isinstance(model, (DictConfig, dict)):
        return None
    if model.get("input_size") is not None:
        return None
    minimum = model.get("min_image_size")
    return int(minimum) if minimum else None


def _image_size(own: Any, *, _root_: DictConfig) -> int | None:
    """`${trainer.image_size:OWN}`: OWN, or the model's minimum where that is larger; null
    (the images' own, unknown until they are read) stays null."""
    if own is None:
        return None
    minimum = model_minimum(OmegaConf.select(_root_, "model", default=None))
    return max(int(own), minimum) if minimum else int(own)


def register_resolver() -> None:
    """Registers `trainer.image_size` (again harmlessly: same function)."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, _image_size)


def _model_name(model: DictConfig) -> str:
    target = str(model.get("_target_", "model"))
    parts = target.split(".")
    return parts[-2] if len(parts) > 1 else parts[0]


def check_image_size(cfg: DictConfig) -> None:
    """Refuses a `dataset.image_size` below the model's minimum, in one line.

    Raises:
        ConfigError: naming both sizes and the fix.
    """
    size = cfg.dataset.get("image_size") if isinstance(cfg.get("dataset"), DictConfig) else None
    minimum = model_minimum(cfg.get("model"))
    if size is None or minimum is None or isinstance(size, bool) or not isinstance(size, int):
        return
    if size < minimum:
        raise ConfigError(
            f"dataset.image_size={size} is below the smallest side model={_model_name(cfg.model)}"
            f" takes, {minimum}x{minimum} (model.min_image_size); leave dataset.image_size out "
            f"(the built-in datasets follow the model's minimum) or set it >= {minimum}")


def image_size_choice(cfg: DictConfig) -> dict[str, Any] | None:
    """The side a run trains at and why, for its summary; None where the dataset has none.

    Returns:
        `{"size": 32, "own": 8, "minimum": 32}`: `own` is the dataset's side before the
        model's minimum raised it (equal to `size` where nothing raised it, or where
        `dataset.image_size` was given), `minimum` the model's (None: any).
    """
    dataset = cfg.get("dataset")
    if not isinstance(dataset, DictConfig) or "image_size" not in dataset:
        return None
    size = dataset.get("image_size")
    if not isinstance(size, int) or isinstance(size, bool):
        return None
    own = size
    if OmegaConf.is_interpolation(dataset, "image_size"):
        # The same interpolation where the model states no minimum: the dataset's own side.
        raw = OmegaConf.to_container(dataset, resolve=False)["image_size"]
        probe = OmegaConf.create({"model": {}, "dataset": {"image_size": raw}})
        try:
            found = probe.dataset.image_size
        except Exception:  # noqa: BLE001 - another interpolation this probe cannot resolve
            found = None
        own = found if isinstance(found, int) else size
    return {"size": size, "own": own, "minimum": model_minimum(cfg.get("model"))}


def describe_choice(choice: dict[str, Any], model: str, dataset: str) -> str:
    """One line: the side used, and why (`32x32: dataset=digits is 8x8, resized up to ...`)."""
    size, own, minimum = choice["size"], choice["own"], choice.get("minimum")
    side = f"{size}x{size}"
    if own != size:
        return (f"{side}: dataset={dataset} is {own}x{own}, resized up to the smallest side "
                f"model={model} takes (model.min_image_size={minimum})")
    if minimum:
        return f"{side} (dataset.image_size; model={model} takes >= {minimum}x{minimum})"
    return f"{side} (dataset.image_size)"
