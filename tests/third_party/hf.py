"""Hugging Face Flax language models, built from tiny configs (no weights are downloaded),
each in a training step written as the transformers docs write one: a causal LM's labels are
its tokens shifted inside the step (SEQ + 1 tokens: SEQ positions after the shift, which a
mesh axis divides).

Every builder returns `(step, args)` like tests/third_party/models.py's.
"""

from __future__ import annotations

import jax
import numpy as np
import optax

BATCH, SEQ, VOCAB, WIDTH, MLP, HEADS = 8, 16, 64, 32, 64, 4


def _tokens(seed=0, length=SEQ, batch=BATCH):
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, length)).astype(np.int32)


def _xent(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _causal_lm_step(model, tx):
    def step(params, opt_state, input_ids):
        def loss_fn(p):
            logits = model(input_ids[:, :-1], params=p).logits
            return _xent(logits, input_ids[:, 1:])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def gpt2(size: int = 1):
    """FlaxGPT2LMHeadModel: 2 layers, 4 heads, width 32, tied embeddings (`size` scales the
    batch, sequence and width)."""
    from transformers import FlaxGPT2LMHeadModel, GPT2Config

    seq = SEQ * size
    config = GPT2Config(vocab_size=VOCAB, n_positions=seq, n_embd=WIDTH * size, n_layer=2,
                        n_head=HEADS)
    model = FlaxGPT2LMHeadModel(config, input_shape=(1, seq), seed=0)
    tx = optax.adamw(1e-3)
    return _causal_lm_step(model, tx), (model.params, tx.init(model.params),
                                         _tokens(length=seq + 1, batch=BATCH * size))


def llama(size: int = 1):
    """FlaxLlamaForCausalLM: 2 layers, 4 query heads over 2 key-value heads, RoPE (`size`
    scales the batch, sequence and widths)."""
    from transformers import FlaxLlamaForCausalLM, LlamaConfig

    seq = SEQ * size
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=WIDTH * size,
                         intermediate_size=MLP * size, num_hidden_layers=2,
                         num_attention_heads=HEADS, num_key_value_heads=2,
                         max_position_embeddings=seq)
    model = FlaxLlamaForCausalLM(config, input_shape=(1, seq), seed=0)
    tx = optax.adamw(1e-3)
    return _causal_lm_step(model, tx), (model.params, tx.init(model.params),
                                         _tokens(length=seq + 1, batch=BATCH * size))


def bert(size: int = 1):
    """FlaxBertForMaskedLM: 2 layers, 4 heads; the labels come with the batch (`size` scales
    the batch, sequence and widths)."""
    from transformers import BertConfig, FlaxBertForMaskedLM

    seq = SEQ * size
    config = BertConfig(vocab_size=VOCAB, hidden_size=WIDTH * size,
                        intermediate_size=MLP * size, num_hidden_layers=2,
                        num_attention_heads=HEADS, max_position_embeddings=seq)
    model = FlaxBertForMaskedLM(config, input_shape=(1, seq), seed=0)
    tx = optax.adamw(1e-3)

    def step(params, opt_state, input_ids, labels):
        def loss_fn(p):
            return _xent(model(input_ids, params=p).logits, labels)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, (model.params, tx.init(model.params), _tokens(length=seq, batch=BATCH * size),
                  _tokens(1, length=seq, batch=BATCH * size))


BUILDERS = {"hf-gpt2": gpt2, "hf-llama": llama, "hf-bert": bert}
