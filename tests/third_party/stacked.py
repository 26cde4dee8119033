"""Training steps whose repeated layers are stacked and scanned, written the way each
library's docs write a layer stack: flax.linen's `nn.scan` (with and without `nn.remat`),
flax.nnx's `nnx.vmap`-created layers applied by `nnx.scan`, penzai's `pz.nn.LayerStack`
and haliax's `hnn.Stacked`. The pipeline tests cut these stacks into stages.

Every builder returns `(step, args)`: `step(*args)` is one optimizer step (loss, gradients,
an optax update) on concrete arrays. Four layers, so 2 and 4 stages divide them; batch 8,
sequence 16, width 32, so a pipelined plan compiles in seconds on 8 simulated devices.
"""

from __future__ import annotations

import jax
import optax

from .models import BATCH, SEQ, VOCAB, WIDTH, _tokens, _xent

LAYERS, HEADS = 4, 4


def linen_stack(remat: bool = False):
    """flax.linen: an embedding, four pre-norm causal decoder blocks under
    `nn.scan(Block)` (or `nn.scan(nn.remat(Block))`), the causal mask broadcast to every
    layer (`nn.broadcast`), a head; AdamW."""
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, mask):
            attention = nn.MultiHeadDotProductAttention(num_heads=HEADS, qkv_features=WIDTH)
            x = x + attention(nn.LayerNorm()(x), mask=mask)
            h = nn.Dense(2 * WIDTH, name="up")(nn.LayerNorm()(x))
            return x + nn.Dense(WIDTH, name="down")(nn.gelu(h)), None

    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(VOCAB, WIDTH)(tokens)
            mask = nn.make_causal_mask(tokens)
            block = nn.remat(Block) if remat else Block
            blocks = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                             in_axes=nn.broadcast, length=LAYERS)
            x, _ = blocks(name="blocks")(x, mask)
            return nn.Dense(VOCAB, name="head")(nn.LayerNorm()(x))

    model = Decoder()
    tokens = _tokens()
    params = model.init(jax.random.key(0), tokens[:, :-1])
    tx = optax.adamw(1e-3)

    def step(params, opt_state, tokens):
        def loss_fn(p):
            return _xent(model.apply(p, tokens[:, :-1]), tokens[:, 1:])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, (params, tx.init(params), tokens)


def nnx_stack(dropout: float = 0.0, shared_norm: bool = False, remat: bool = False):
    """flax.nnx: four MLP blocks created by `nnx.vmap` over split `nnx.Rngs` and applied by
    `nnx.scan` with the activations as `nnx.Carry` (flax's "scan over layers" guide), between
    an embedding and a head; nnx.Optimizer with Adam. With `dropout`, each block drops its
    MLP's output with its own key (the guide's `nnx.Dropout` in the stacked block). With
    `shared_norm`, one LayerNorm is broadcast to every block (`in_axes=None`), so the
    backward scan sums its gradient over the layers. With `remat`, the scanned function is
    under `nnx.remat` (each block's input kept, the rest recomputed)."""
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.norm = None if shared_norm else nnx.LayerNorm(WIDTH, rngs=rngs)
            self.up = nnx.Linear(WIDTH, 2 * WIDTH, rngs=rngs)
            self.down = nnx.Linear(2 * WIDTH, WIDTH, rngs=rngs)
            self.drop = nnx.Dropout(dropout, rngs=rngs)

        def __call__(self, x, norm):
            return x + self.drop(self.down(nnx.gelu(self.up(norm(x)))))

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
            self.norm = nnx.LayerNorm(WIDTH, rngs=rngs) if shared_norm else None

            @nnx.split_rngs(splits=LAYERS)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def create_blocks(rngs):
                return Block(rngs)

            self.blocks = create_blocks(rngs)
            self.head = nnx.Linear(WIDTH, VOCAB, rngs=rngs)

        def __call__(self, tokens):
            def forward(x, block, shared):
                return block(x, shared if shared_norm else block.norm)

            forward = nnx.remat(forward) if remat else forward
            forward = nnx.scan(forward, in_axes=(nnx.Carry, 0, None), out_axes=nnx.Carry)
            return self.head(forward(self.embed(tokens), self.blocks, self.norm))

    net = Model(nnx.Rngs(0, dropout=1))
    opt = nnx.Optimizer(net, optax.adam(1e-3), wrt=nnx.Param)
    graphdef, state = nnx.split((net, opt))

    def step(state, tokens):
        model, optimizer = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(
            lambda m: _xent(m(tokens[:, :-1]), tokens[:, 1:]))(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    return step, (state, _tokens())


def penzai_stack():
    """penzai: its own llama-like decoder (`build_llamalike_transformer`: RoPE, grouped-query
    causal attention, a SwiGLU MLP, RMS norms) with `use_layer_stack=True`, which puts the
    four blocks in a `pz.nn.LayerStack` (one prototype block whose parameters carry a named
    "blocks" axis, called under `lax.scan`); parameters unbound with `pz.unbind_params` and
    trained with Adam on their values."""
    from penzai import pz
    from penzai.models.transformer.variants import llamalike_common

    config = llamalike_common.LlamalikeTransformerConfig(
        num_kv_heads=2, query_head_multiplier=2, embedding_dim=WIDTH, projection_dim=8,
        mlp_hidden_dim=2 * WIDTH, num_decoder_blocks=LAYERS, vocab_size=VOCAB,
        mlp_variant="swiglu", tie_embedder_and_logits=False, use_layer_stack=True)
    model = llamalike_common.build_llamalike_transformer(config, jax.random.key(0))
    unbound, params = pz.unbind_params(model, freeze=True)
    tx = optax.adam(1e-3)

    def step(params, opt_state, tokens):
        def loss_fn(params):
            logits = pz.bind_variables(unbound, params)(
                pz.nx.wrap(tokens[:, :-1]).tag("batch", "seq"))
            return _xent(logits.unwrap("batch", "seq", "vocabulary"), tokens[:, 1:])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, (params, tx.init(params), _tokens())


def haliax_stack(gradient_checkpointing=False):
    """haliax: an embedding, four residual MLP blocks in `hnn.Stacked` (the layers' weights
    stacked along a named "layers" axis, applied by `fold`, a `lax.scan`), a head, over
    named Batch / Pos / Embed axes; equinox's filter_value_and_grad and AdamW.
    `gradient_checkpointing`: Stacked's policy (True: each block's input kept, the rest
    recomputed, as Levanter's models default to)."""
    import equinox as eqx
    import haliax as hax
    import haliax.nn as hnn

    Batch, Pos = hax.Axis("batch", BATCH), hax.Axis("position", SEQ - 1)
    Embed, Mlp = hax.Axis("embed", WIDTH), hax.Axis("mlp", 2 * WIDTH)
    Vocab, Layers = hax.Axis("vocab", VOCAB), hax.Axis("layers", LAYERS)

    class Block(eqx.Module):
        norm: hnn.LayerNorm
        up: hnn.Linear
        down: hnn.Linear

        @staticmethod
        def init(*, key):
            k1, k2 = jax.random.split(key)
            return Block(hnn.LayerNorm.init(Embed), hnn.Linear.init(Embed, Mlp, key=k1),
                         hnn.Linear.init(Mlp, Embed, key=k2))

        def __call__(self, x):
            return x + self.down(hnn.gelu(self.up(self.norm(x))))

    class Model(eqx.Module):
        embed: hnn.Embedding
        blocks: hnn.Stacked
        head: hnn.Linear

        @staticmethod
        def init(key):
            k1, k2, k3 = jax.random.split(key, 3)
            stacked = hnn.Stacked.init(Layers, Block,
                                       gradient_checkpointing=gradient_checkpointing)
            return Model(hnn.Embedding.init(Vocab, Embed, key=k1),
                         stacked(key=jax.random.split(k2, LAYERS)),
                         hnn.Linear.init(Embed, Vocab, key=k3))

        def __call__(self, tokens):
            return self.head(self.blocks.fold(self.embed(tokens)))

    model = Model.init(jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    tx = optax.adamw(1e-3)

    def step(params, opt_state, tokens):
        @eqx.filter_value_and_grad
        def loss_fn(m):
            inputs = hax.named(tokens[:, :-1], (Batch, Pos))
            logits = m(inputs).rearrange((Batch, Pos, Vocab)).array
            return _xent(logits, tokens[:, 1:])

        loss, grads = loss_fn(eqx.combine(params, static))
        updates, opt_state = tx.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss

    return step, (params, tx.init(params), _tokens())


STACKED = {
    "linen-scan": (linen_stack, "flax"),
    "linen-scan-remat": (lambda: linen_stack(remat=True), "flax"),
    "nnx-scan": (nnx_stack, "flax"),
    "nnx-scan-remat": (lambda: nnx_stack(remat=True), "flax"),
    "nnx-scan-shared-norm": (lambda: nnx_stack(shared_norm=True), "flax"),
    "nnx-scan-dropout": (lambda: nnx_stack(dropout=0.1), "flax"),
    "penzai-stack": (penzai_stack, "penzai"),
    "haliax-stacked": (haliax_stack, "haliax"),
    "haliax-stacked-remat": (lambda: haliax_stack(True), "haliax"),
    "haliax-stacked-nested": (lambda: haliax_stack("nested"), "haliax"),
}
