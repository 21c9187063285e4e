"""TensorFlow 2.21's runtime switches that its public API does not export: turning op
determinism off again, asking which kernels this build registers, whether its oneDNN CPU
kernels are on, and whether its runtime has started."""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import config as tf_config
from tensorflow.python.framework import kernels
from tensorflow.python.util import _pywrap_util_port

from trainer.internals import check_version

check_version("tensorflow", tf.__version__)


def disable_op_determinism() -> None:
    """Turns TensorFlow's process-wide op determinism off where it is on
    (`tf.config.experimental.enable_op_determinism` has no public inverse)."""
    if tf_config.is_op_determinism_enabled():
        tf_config.disable_op_determinism()


def has_kernel(op: str) -> bool:
    """Whether this TensorFlow build registers a kernel for `op` (e.g. `NcclAllReduce`)."""
    return bool(kernels.get_registered_kernels_for_op(op).kernel)


def onednn_enabled() -> bool:
    """Whether TensorFlow's oneDNN CPU kernels are on in this process: read once as
    TensorFlow starts, from `TF_ENABLE_ONEDNN_OPTS` or else the CPU's default (on where it
    has AVX-512 VNNI, BF16 or AMX), so setting the variable later changes nothing."""
    return bool(_pywrap_util_port.IsMklEnabled())


def runtime_started() -> bool:
    """Whether TensorFlow's runtime has started in this process (a tensor, a variable, a
    layer's weights or a dataset made; listing the physical devices does not start it):
    from then on its devices, oneDNN's kernels and collective ops are fixed."""
    found = context.context_safe()
    return found is not None and bool(found._initialized)
