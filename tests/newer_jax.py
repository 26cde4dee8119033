"""Equations that JAX traces only elsewhere, built here so their rules and costs are tested on
the JAX this suite runs: cuDNN's fused attention (traced on a GPU) and JAX 0.11's
`one_minus_square` (tanh's derivative). Both bind the primitive itself: tracing needs only its
abstract evaluation, never a GPU or a lowering."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax._src.cudnn import fused_attention_stablehlo as _cudnn

_EXTRAS = 7  # bias, q_seqlen, kv_seqlen, q_offsets, kv_offsets, page_table_k, page_table_v


def _common(causal: bool, head_dim: int) -> dict:
    mask = _cudnn.MaskType.CAUSAL if causal else _cudnn.MaskType.NO_MASK
    return dict(scale=head_dim ** -0.5, seed=0, dropout_rate=0.0, variadic_args=(False, False),
                mask_type=mask, layout=_cudnn.AttentionLayout.BTNH.value,
                sliding_window_length=None)


def cudnn_attention(q, k, v, causal: bool = True):
    """(output, softmax statistics) of cuDNN's forward, q [B, T, N, H], k and v [B, S, K, H]."""
    empty = jnp.zeros((0,), q.dtype)
    return _cudnn._dot_product_attention_fwd_p_wrapper.bind(
        q, k, v, *[empty] * _EXTRAS, **_common(causal, q.shape[-1]), is_training=True)


def cudnn_attention_grads(q, k, v, stats, out, d_out, causal: bool = True):
    """(dq, dk, dv) of cuDNN's backward."""
    empty = jnp.zeros((0,), q.dtype)
    return _cudnn._dot_product_attention_bwd_p_wrapper.bind(
        q, k, v, *[empty] * _EXTRAS, stats, out, d_out, **_common(causal, q.shape[-1]))


def cudnn_attention_step(q, k, v, causal: bool = True):
    """Forward and backward of cuDNN attention as a GPU trace of its gradient holds them."""
    out, stats = cudnn_attention(q, k, v, causal)
    d_out = jnp.ones_like(out)
    return cudnn_attention_grads(q, k, v, stats, out, d_out, causal)


def _one_minus_square_primitive():
    prim = jax.extend.core.Primitive("one_minus_square")
    prim.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    prim.def_impl(lambda x: 1 - x * x)
    return prim


ONE_MINUS_SQUARE = _one_minus_square_primitive()


def one_minus_square(x):
    """1 - x^2 as JAX 0.11 records it in tanh's derivative."""
    return ONE_MINUS_SQUARE.bind(x)
