"""Equations that JAX traces only elsewhere, built here so their rules and costs are tested on
the JAX this suite runs: cuDNN's fused attention (traced on a GPU; toast_lab.zoo's binding of
its primitives, which needs only their abstract evaluation) and JAX 0.11's `one_minus_square`
(tanh's derivative)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from toast_lab.zoo._cudnn import causal_attention, forward


def cudnn_attention(q, k, v):
    """(output, softmax statistics) of cuDNN's causal forward."""
    return forward(q, k, v)


def cudnn_attention_step(q, k, v):
    """dq, dk, dv of cuDNN attention: its forward and backward custom calls, as a GPU trace of
    the gradient holds them."""
    return jax.grad(lambda q, k, v: causal_attention(q, k, v).astype(jnp.float32).sum(),
                    argnums=(0, 1, 2))(q, k, v)


def _one_minus_square_primitive():
    prim = jax.extend.core.Primitive("one_minus_square")
    prim.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    prim.def_impl(lambda x: 1 - x * x)
    return prim


ONE_MINUS_SQUARE = _one_minus_square_primitive()


def one_minus_square(x):
    """1 - x^2 as JAX 0.11 records it in tanh's derivative."""
    return ONE_MINUS_SQUARE.bind(x)
