"""Causal language models from libraries whose own layers build the transformer: a flax.nnx
decoder, penzai's Llama-like transformer and Keras-Hub's GPT-2, Llama and Mixtral (a
mixture of experts), each from a tiny config (no weights are downloaded) in a training step
written the way that library's docs write one. The labels are the tokens shifted inside the
step (SEQ + 1 tokens: SEQ positions after the shift, which a mesh axis divides).

Every builder returns `(step, args)` like tests/third_party/models.py's; `size` scales the
batch, sequence and width (1: batch 8, sequence 16, width 32).
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")  # before keras is first imported

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

BATCH, SEQ, VOCAB, WIDTH, HEADS, LAYERS = 8, 16, 64, 32, 4, 2


def _tokens(batch, seq, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, seq + 1)).astype(np.int32)


def _xent(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _optax_step(loss_fn, tx):
    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


# ---- flax.nnx ------------------------------------------------------------------------------


def nnx_transformer(size: int = 1):
    """flax.nnx: a pre-norm decoder (nnx.Embed, nnx.MultiHeadAttention with a causal mask,
    a GELU MLP, nnx.LayerNorm), split into graphdef and params, AdamW from optax."""
    from flax import nnx

    width = WIDTH * size

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.norm1 = nnx.LayerNorm(width, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(HEADS, width, decode=False, rngs=rngs)
            self.norm2 = nnx.LayerNorm(width, rngs=rngs)
            self.up = nnx.Linear(width, 4 * width, rngs=rngs)
            self.down = nnx.Linear(4 * width, width, rngs=rngs)

        def __call__(self, x, mask):
            x = x + self.attn(self.norm1(x), mask=mask)
            return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))

    class Decoder(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(VOCAB, width, rngs=rngs)
            self.blocks = nnx.List([Block(rngs) for _ in range(LAYERS)])
            self.norm = nnx.LayerNorm(width, rngs=rngs)

        def __call__(self, tokens):
            x = self.embed(tokens)
            mask = nnx.make_causal_mask(tokens)
            for block in self.blocks:
                x = block(x, mask)
            return self.embed.attend(self.norm(x))

    graphdef, params = nnx.split(Decoder(nnx.Rngs(0)), nnx.Param)
    tx = optax.adamw(1e-3, weight_decay=0.01)

    def loss_fn(params, tokens):
        model = nnx.merge(graphdef, params)
        return _xent(model(tokens[:, :-1]), tokens[:, 1:])

    return _optax_step(loss_fn, tx), (params, tx.init(params), _tokens(BATCH * size,
                                                                          SEQ * size))


# ---- penzai --------------------------------------------------------------------------------


def penzai_llama(size: int = 1):
    """penzai: `build_llamalike_transformer` (RMS norm, RoPE, SwiGLU, grouped queries), its
    parameters unbound and frozen into a dict the step binds back (penzai's training
    tutorial), AdamW from optax."""
    from penzai import pz
    from penzai.models.transformer.variants import llamalike_common

    width = WIDTH * size
    config = llamalike_common.LlamalikeTransformerConfig(
        num_kv_heads=2, query_head_multiplier=2, embedding_dim=width,
        projection_dim=width // HEADS, mlp_hidden_dim=2 * width, num_decoder_blocks=LAYERS,
        vocab_size=VOCAB, mlp_variant="swiglu", tie_embedder_and_logits=False)
    model = llamalike_common.build_llamalike_transformer(config, jax.random.key(0))
    unbound, frozen = pz.unbind_params(model, freeze=True)
    params = {p.label: p.value for p in frozen}
    tx = optax.adamw(1e-3)

    def loss_fn(params, tokens):
        bound = pz.bind_variables(unbound, [pz.ParameterValue(label=k, value=v)
                                            for k, v in params.items()])
        logits = bound(pz.nx.wrap(tokens[:, :-1]).tag("batch", "seq"))
        return _xent(logits.unwrap("batch", "seq", "vocabulary"), tokens[:, 1:])

    return _optax_step(loss_fn, tx), (params, tx.init(params), _tokens(BATCH * size,
                                                                          SEQ * size))


# ---- Keras-Hub -----------------------------------------------------------------------------


def _keras_hub_step(causal_lm, size):
    """A Keras-Hub causal LM trained statelessly with AdamW (stateless_call,
    stateless_apply), the token ids and a full padding mask as its inputs."""
    import keras

    from tests.third_party.models import _fresh_keras

    _fresh_keras()
    with jax.numpy_rank_promotion("allow"):
        model = causal_lm(WIDTH * size)
        opt = keras.optimizers.AdamW(1e-3)
        opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def compute_loss(trainable, non_trainable, tokens):
        x = {"token_ids": tokens[:, :-1], "padding_mask": jnp.ones_like(tokens[:, :-1])}
        logits, non_trainable = model.stateless_call(trainable, non_trainable, x,
                                                     training=True)
        return loss_fn(tokens[:, 1:], logits), non_trainable

    grad_fn = jax.value_and_grad(compute_loss, has_aux=True)

    def step(state, tokens):
        with jax.numpy_rank_promotion("allow"):
            trainable, non_trainable, opt_vars = state
            (loss, non_trainable), grads = grad_fn(trainable, non_trainable, tokens)
            trainable, opt_vars = opt.stateless_apply(opt_vars, grads, trainable)
            return loss, (trainable, non_trainable, opt_vars)

    state = ([v.value for v in model.trainable_variables],
             [v.value for v in model.non_trainable_variables],
             [v.value for v in opt.variables])
    return step, (state, _tokens(BATCH * size, SEQ * size))


def keras_hub_gpt2(size: int = 1):
    """Keras-Hub: GPT2CausalLM on a 2-layer GPT2Backbone (tied embeddings)."""
    import keras_hub

    def build(width):
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=VOCAB, num_layers=LAYERS, num_heads=HEADS, hidden_dim=width,
            intermediate_dim=4 * width, max_sequence_length=SEQ * size)
        return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)

    return _keras_hub_step(build, size)


def keras_hub_llama(size: int = 1):
    """Keras-Hub: LlamaCausalLM on a 2-layer LlamaBackbone (4 query heads over 2 key-value
    heads, RoPE, SwiGLU)."""
    import keras_hub

    def build(width):
        backbone = keras_hub.models.LlamaBackbone(
            vocabulary_size=VOCAB, num_layers=LAYERS, num_query_heads=HEADS,
            num_key_value_heads=2, hidden_dim=width, intermediate_dim=2 * width)
        return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)

    return _keras_hub_step(build, size)


def keras_hub_mixtral(size: int = 1):
    """Keras-Hub: MixtralCausalLM on a 2-layer MixtralBackbone (4 experts, top-2 routing,
    grouped queries)."""
    import keras_hub

    def build(width):
        backbone = keras_hub.models.MixtralBackbone(
            vocabulary_size=VOCAB, num_layers=LAYERS, num_query_heads=HEADS,
            num_key_value_heads=2, hidden_dim=width, intermediate_dim=2 * width,
            num_experts=4, top_k=2)
        return keras_hub.models.MixtralCausalLM(backbone=backbone, preprocessor=None)

    return _keras_hub_step(build, size)


BUILDERS = {"nnx-transformer": nnx_transformer, "penzai-llama": penzai_llama,
            "keras-hub-gpt2": keras_hub_gpt2, "keras-hub-llama": keras_hub_llama,
            "keras-hub-mixtral": keras_hub_mixtral}
