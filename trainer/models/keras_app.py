"""Any `keras.applications` network as a backbone, with a new classification head.

`model=keras_app model.name=ResNet50V2` (or EfficientNetV2B0, ConvNeXtTiny, MobileNetV3Small,
any constructor `keras.applications` has) with `model.weights`: null (from scratch),
`imagenet` (Keras downloads the ImageNet weights once into ~/.keras/models), or a local file:
Keras's own weights file of that network (the `..._notop.h5` it would download), a
`.weights.h5` file, or a `.keras` checkpoint of an earlier run of the same network. The
family's own `preprocess_input` runs inside the model (inputs arrive in [0, 1] from the
pipeline; the layer brings them to the 0-255 range every family expects first, and grey
images to three channels), so a saved model takes the same inputs as the pipeline gives.
"""

from __future__ import annotations

import difflib
import importlib
import re
import warnings
from pathlib import Path
from typing import Any

import keras

from trainer.config.errors import ConfigError
from trainer.rundir.checkpoint import verified

BACKBONE = "backbone"  # the backbone's layer name: what fine-tuning freezes and unfreezes


def constructors() -> dict[str, Any]:
    """Every network constructor `keras.applications` has, by name."""
    return {name: getattr(keras.applications, name) for name in dir(keras.applications)
            if name[:1].isupper() and callable(getattr(keras.applications, name))}


def find(name: str) -> Any:
    """The constructor called `name`; an unknown name lists the close matches."""
    found = constructors()
    if name in found:
        return found[name]
    close = difflib.get_close_matches(name, list(found), n=5, cutoff=0.5)
    lowered = {n.lower(): n for n in found}
    if name.lower() in lowered:
        close = [lowered[name.lower()]]
    hint = f"close matches: {', '.join(close)}" if close else f"available: {', '.join(found)}"
    raise ConfigError(f"model.name={name!r} is not a keras.applications network; {hint}")


@keras.saving.register_keras_serializable(package="trainer")
class AppPreprocess(keras.layers.Layer):
    """[0, 1] images to what a `keras.applications` family expects: 0-255, three channels,
    then the family's own `preprocess_input` (`module` names it, e.g.
    `keras.src.applications.resnet_v2`)."""

    def __init__(self, module: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.module = module
        self._preprocess = importlib.import_module(module).preprocess_input

    def call(self, inputs):
        x = keras.ops.cast(inputs, "float32") * 255.0
        if x.shape[-1] == 1:
            x = keras.ops.repeat(x, 3, axis=-1)
        return self._preprocess(x)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], 3)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "module": self.module}


def build(input_shape: tuple[int, ...], num_classes: int, name: str = "MobileNetV2",
          weights: str | None = None, input_size: int | None = None, pooling: str = "avg",
          dropout: float = 0.2, min_image_size: int | None = None) -> keras.Model:
    """Builds `name` from `keras.applications` without its top, and a new head.

    Args:
        input_shape: `(height, width, channels)` of the pipeline's images.
        num_classes: outputs of the new head.
        name: the constructor, e.g. `ResNet50V2`.
        weights: None, `imagenet`, or the path of a local weights file or checkpoint.
        input_size: the square side the backbone sees (images are resized in the model);
            None: the images' own size.
        pooling: `avg` or `max` over the backbone's last feature map.
        dropout: before the new classification layer.
        min_image_size: the smallest image side the backbone takes where `input_size` is
            None (the config's; the built-in datasets resize up to it); None: the network's
            own check.

    Returns:
        An uncompiled model: inputs -> preprocessing -> `backbone` -> pooling -> head.
    """
    constructor = find(name)
    if pooling not in ("avg", "max"):
        raise ConfigError(f"model.pooling must be avg or max; received: {pooling!r}")
    size = input_size or input_shape[0]
    if input_size is None and min_image_size and min(input_shape[:2]) < min_image_size:
        raise ConfigError(f"model=keras_app ({name}) needs images of at least "
                          f"{min_image_size}x{min_image_size}; received: "
                          f"{input_shape[0]}x{input_shape[1]} (set dataset.image_size>="
                          f"{min_image_size}, or model.input_size to resize in the model)")
    inputs = keras.Input(shape=tuple(input_shape))
    x = inputs
    if (size, size) != tuple(input_shape[:2]):
        x = keras.layers.Resizing(size, size, name="resize")(x)
    x = AppPreprocess(constructor.__module__, name="preprocess")(x)
    backbone = _backbone(constructor, name, (size, size, 3), weights)
    x = backbone(x)
    x = (keras.layers.GlobalAveragePooling2D if pooling == "avg"
         else keras.layers.GlobalMaxPooling2D)(name="pool")(x)
    x = keras.layers.Dropout(dropout, name="head_dropout")(x)
    # The softmax in float32 keeps the loss stable under mixed precision.
    outputs = keras.layers.Dense(num_classes, activation="softmax", dtype="float32",
                                 name="head")(x)
    return keras.Model(inputs, outputs, name=f"{name}_classifier")


def _backbone(constructor: Any, name: str, shape: tuple[int, int, int],
              weights: str | None) -> keras.Model:
    local = weights not in (None, "imagenet")
    try:
        base = constructor(include_top=False, weights=None if local else weights,
                           input_shape=shape)
    except ValueError as error:  # e.g. an input below the network's minimum size
        raise ConfigError(f"model.name={name}: {str(error).strip().splitlines()[0]}") from None
    except Exception as error:
        if weights == "imagenet" and "URL fetch failure" in str(error):
            raise ConfigError(_offline_message(name, str(error))) from None
        raise
    backbone = keras.Model(base.input, base.output, name=BACKBONE)
    if local:
        _load_local(backbone, name, Path(str(weights)).expanduser())
    return backbone


def _offline_message(name: str, error: str) -> str:
    url = re.search(r"https?://\S+?\.h5", error)
    file = url.group(0).rsplit("/", 1)[1] if url else f"the {name} ImageNet weights"
    where = f" from {url.group(0)}" if url else ""
    return (f"model.weights=imagenet: Keras could not download {file}{where} (no network); "
            f"fetch it on a connected machine and pass model.weights=/path/to/{file}, or put "
            "it in ~/.keras/models/")


def _load_local(backbone: keras.Model, name: str, path: Path) -> None:
    """Loads a local weights file or an earlier run's checkpoint into the backbone."""
    if not path.is_file():
        raise ConfigError(f"model.weights={path} does not exist; valid: null, imagenet, or "
                          "the path of a weights file or .keras checkpoint")
    try:
        if path.suffix == ".keras":
            # compile=False: only the layers are needed, not the optimizer's state.
            saved = keras.models.load_model(verified(path), compile=False)
            try:
                source = saved.get_layer(BACKBONE)
            except ValueError:
                raise ValueError("it holds no backbone layer (not a model=keras_app "
                                 "checkpoint)") from None
            backbone.set_weights(source.get_weights())
        else:
            # Keras skips the parts of a weights file that match no layer with a warning;
            # a file that does not load whole is refused here.
            with warnings.catch_warnings():
                warnings.filterwarnings("error", message="Skipping")
                backbone.load_weights(str(path))
    except ConfigError:
        raise
    except Exception as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(f"model.weights={path} does not fit {name} at this input size "
                          f"({first[:300]})") from None
