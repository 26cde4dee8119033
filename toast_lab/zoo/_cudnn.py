"""cuDNN's flash attention as a GPU traces it, traceable anywhere.

`jax.nn.dot_product_attention(..., implementation="cudnn")` checks for cuDNN while it traces, so
a CPU cannot trace a step that uses it, and the recipes in benchmarks/step_time.py trace
abstractly on a CPU. This binds the same custom calls (jax/_src/cudnn/fused_attention_stablehlo.py)
with the same differentiation rule, so the jaxpr is the one a GPU trace holds; on a GPU it
lowers and runs as cuDNN's kernel, elsewhere it only traces.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _module():
    try:
        from jax._src.cudnn import fused_attention_stablehlo as module
    except ImportError as err:  # a JAX without cuDNN attention
        raise NotImplementedError(f"this JAX has no cuDNN attention to trace ({err})") from None
    return module


def _params(head_dim: int) -> dict:
    m = _module()
    return dict(scale=head_dim ** -0.5, seed=0, dropout_rate=0.0, variadic_args=(False, False),
                mask_type=m.MaskType.CAUSAL, layout=m.AttentionLayout.BTNH.value,
                sliding_window_length=None)


def _extras(dtype) -> list:
    # bias, q_seqlen, kv_seqlen, q_offsets, kv_offsets, page_table_k, page_table_v: unused
    return [jnp.zeros((0,), dtype)] * 7


def _forward(q, k, v):
    out, stats = _module()._dot_product_attention_fwd_p_wrapper.bind(
        q, k, v, *_extras(q.dtype), **_params(q.shape[-1]), is_training=True)
    return out, (q, k, v, stats, out)


def _backward(res, d_out):
    q, k, v, stats, out = res
    dq, dk, dv = _module()._dot_product_attention_bwd_p_wrapper.bind(
        q, k, v, *_extras(q.dtype), stats, out, d_out, **_params(q.shape[-1]))
    return dq, dk, dv


@jax.custom_vjp
def causal_attention(q, k, v):
    """Causal attention of q [B, T, N, H] over k, v [B, S, K, H] (K divides N) by cuDNN."""
    return _forward(q, k, v)[0]


causal_attention.defvjp(_forward, _backward)
