"""make_inplace: PyTorch ops that write their results where the caller says.

In place over their input (``square_matmul_``, ``softmax_``, ``layer_norm_``,
``rms_norm_``; whole residual blocks in ``make_inplace.blocks``) or
into caller-owned buffers (``out=``), with CUDA and CPU kernels behind
``torch.ops.make_inplace``.
"""

from ._loader import load as _load

_load()

from .ops import *  # noqa: E402,F401,F403
from .ops import __all__ as _ops_all  # noqa: E402
from . import nn  # noqa: E402,F401
from . import blocks  # noqa: E402,F401
from .convert import ConversionReport, convert_  # noqa: E402


def build_backends() -> list[str]:
    """The backends compiled into the loaded library, e.g. ``['cpu', 'cuda']``."""
    import torch

    return torch.ops.make_inplace.build_backends().split(",")


__all__ = list(_ops_all) + ["build_backends"]
__all__ += ["convert_", "ConversionReport"]
__version__ = "0.1.0"
