"""cuDNN's flash attention as a GPU traces it, traceable anywhere.

`jax.nn.dot_product_attention(..., implementation="cudnn")` checks for cuDNN while it traces, so
a CPU cannot trace a step that uses it, and the recipes in benchmarks/step_time.py trace
abstractly on a CPU. This binds the same custom calls (jax/_src/cudnn/fused_attention_stablehlo.py)
with the same differentiation rule, so the jaxpr is the one a GPU trace holds; on a GPU it
lowers and runs as cuDNN's kernel, elsewhere it only traces.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


@functools.cache
def _cudnn():
    try:
        from jax._src.cudnn import fused_attention_stablehlo
    except ImportError as err:
        raise ImportError(f"attention='cudnn' binds JAX's cuDNN attention primitives "
                          f"(jax._src.cudnn.fused_attention_stablehlo), which JAX "
                          f"{jax.__version__} does not have ({err}); use attention=None") from None
    return fused_attention_stablehlo


def _params(head_dim: int, causal: bool) -> dict:
    m = _cudnn()
    return dict(scale=head_dim ** -0.5, seed=0, dropout_rate=0.0, variadic_args=(False, False),
                mask_type=m.MaskType.CAUSAL if causal else m.MaskType.NO_MASK,
                layout=m.AttentionLayout.BTNH.value, sliding_window_length=None)


def _unused(dtype) -> list:
    # bias, q_seqlen, kv_seqlen, q_offsets, kv_offsets, page_table_k, page_table_v
    return [jnp.zeros((0,), dtype)] * 7


def forward(q, k, v, causal: bool = True):
    """(output, softmax statistics) of cuDNN's forward: q [B, T, N, H], k and v [B, S, K, H]
    (K divides N)."""
    return _cudnn()._dot_product_attention_fwd_p_wrapper.bind(
        q, k, v, *_unused(q.dtype), **_params(q.shape[-1], causal), is_training=True)


def backward(q, k, v, stats, out, d_out, causal: bool = True):
    """(dq, dk, dv) of cuDNN's backward."""
    return _cudnn()._dot_product_attention_bwd_p_wrapper.bind(
        q, k, v, *_unused(q.dtype), stats, out, d_out, **_params(q.shape[-1], causal))


@jax.custom_vjp
def causal_attention(q, k, v):
    """Causal attention of q [B, T, N, H] over k, v [B, S, K, H] by cuDNN."""
    return forward(q, k, v)[0]


def _fwd(q, k, v):
    out, stats = forward(q, k, v)
    return out, (q, k, v, stats, out)


def _bwd(res, d_out):
    return tuple(backward(*res, d_out))


causal_attention.defvjp(_fwd, _bwd)
