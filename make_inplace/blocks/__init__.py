"""Residual blocks computed in place over the residual stream, by row panels (inference).

``residual_mlp_`` and ``residual_attention_`` overwrite x (rows = tokens) with
``x + block(x)`` (pre-norm) or ``norm(x + block(x))`` (post-norm), holding only
one panel's temporaries at a time. :class:`Norm` describes the layer / RMS norm.
"""

from .attention import residual_attention_
from .mlp import residual_mlp_
from .norm import Norm

__all__ = ["residual_mlp_", "residual_attention_", "Norm"]
