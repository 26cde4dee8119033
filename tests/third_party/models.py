"""One tiny training step per library, written the way that library's docs write one.

Every builder returns `(step, args)`: `step(*args)` is one optimizer step on concrete arrays.
Sizes are small (batch 8) so each plan compiles in about a second on 8 simulated devices.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")  # before keras is first imported

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

BATCH, SEQ, VOCAB, WIDTH, CLASSES = 8, 16, 64, 32, 8


def _tokens(seed=0, shape=(BATCH, SEQ)):
    return np.random.default_rng(seed).integers(0, VOCAB, shape).astype(np.int32)


def _images(seed=0):
    return np.random.default_rng(seed).normal(size=(BATCH, 16, 16, 3)).astype(np.float32)


def _labels(seed=0):
    return np.random.default_rng(seed + 1).integers(0, CLASSES, (BATCH,)).astype(np.int32)


def _xent(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def linen_scan_remat():
    """flax.linen: an embedding, three residual MLP blocks under `nn.scan(nn.remat(...))`,
    AdamW with a warmup-cosine schedule and global-norm clipping."""
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            h = nn.Dense(2 * WIDTH, name="up")(nn.LayerNorm()(x))
            return x + nn.Dense(WIDTH, name="down")(nn.gelu(h)), None

    class Model(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(VOCAB, WIDTH)(tokens)
            blocks = nn.scan(nn.remat(Block), variable_axes={"params": 0},
                             split_rngs={"params": True}, length=3)
            x, _ = blocks(name="blocks")(x, None)
            return nn.Dense(VOCAB, name="head")(x)

    model = Model()
    tokens = _tokens()
    params = model.init(jax.random.key(0), tokens)
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 1e-3, 10, 100)))

    def step(params, opt_state, tokens):
        def loss_fn(p):
            logits = model.apply(p, tokens[:, :-1])
            return _xent(logits, tokens[:, 1:])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, (params, tx.init(params), tokens)


def nnx_dropout_batchnorm():
    """flax.nnx: Linear -> BatchNorm -> ReLU -> Dropout -> Linear with `nnx.Rngs` (the step
    returns the advanced RNG key and the batch statistics), trained with nnx.Optimizer."""
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            # no bias before BatchNorm (it would be subtracted out: its gradient is rounding
            # noise, which Adam scales up to a learning-rate-sized update; see verify's limits)
            self.l1 = nnx.Linear(WIDTH, 64, use_bias=False, rngs=rngs)
            self.bn = nnx.BatchNorm(64, rngs=rngs)
            self.drop = nnx.Dropout(0.1, rngs=rngs)
            self.l2 = nnx.Linear(64, CLASSES, rngs=rngs)

        def __call__(self, x):
            return self.l2(self.drop(nnx.relu(self.bn(self.l1(x)))))

    net = Net(nnx.Rngs(0, dropout=1))
    opt = nnx.Optimizer(net, optax.adam(1e-3), wrt=nnx.Param)
    graphdef, state = nnx.split((net, opt))
    x = np.random.default_rng(0).normal(size=(BATCH, WIDTH)).astype(np.float32)

    def step(state, x, y):
        model, optimizer = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(lambda m: _xent(m(x), y))(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    return step, (state, x, _labels())


def equinox_filter():
    """equinox: an eqx.Module MLP, `eqx.filter_value_and_grad`, params and static split with
    `eqx.partition` (the params tree has `None` leaves), AdamW."""
    import equinox as eqx

    class MLP(eqx.Module):
        layers: list
        act: object = eqx.field(static=True)

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.layers = [eqx.nn.Linear(WIDTH, 64, key=k1), eqx.nn.Linear(64, CLASSES, key=k2)]
            self.act = jax.nn.relu

        def __call__(self, x):
            return self.layers[1](self.act(self.layers[0](x)))

    model = MLP(jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_array)
    tx = optax.adamw(1e-3)
    x = np.random.default_rng(0).normal(size=(BATCH, WIDTH)).astype(np.float32)

    def step(params, opt_state, x, y):
        @eqx.filter_value_and_grad
        def loss_fn(model):
            return _xent(jax.vmap(model)(x), y)

        loss, grads = loss_fn(eqx.combine(params, static))
        updates, opt_state = tx.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss

    return step, (params, tx.init(params), x, _labels())


def haiku_resnet():
    """haiku: a tiny ResNet (hk.nets.ResNet, 4 stages of 2 blocks, 8..64 channels) with batch
    norm under `hk.transform_with_state`, Adam."""
    import haiku as hk

    def forward(x, is_training):
        net = hk.nets.ResNet(blocks_per_group=(2, 2, 2, 2), num_classes=CLASSES,
                             bottleneck=False, channels_per_group=(8, 16, 32, 64),
                             use_projection=(False, True, True, True), name="res_net18",
                             initial_conv_config={"output_channels": 8})
        return net(x, is_training)

    net = hk.transform_with_state(forward)
    images = _images()
    params, state = net.init(jax.random.key(0), images, True)
    tx = optax.adam(1e-3)

    def step(params, state, opt_state, images, labels):
        def loss_fn(p):
            logits, new_state = net.apply(p, state, None, images, True)
            return _xent(logits, labels), new_state

        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), state, opt_state, loss

    return step, (params, state, tx.init(params), images, _labels())


def keras_transformer():
    """Keras 3 on JAX: token embedding, multi-head attention, an MLP and layer norms, trained
    with `model.stateless_call` and `optimizer.stateless_apply` (state as lists of arrays).
    Keras broadcasts biases by rank promotion, which the tests' strict mode forbids: the model
    is built and the step runs with it allowed."""
    with jax.numpy_rank_promotion("allow"):
        return _keras_transformer()


def _fresh_keras():
    """keras, on the JAX backend, in a fresh session: layer names come from a process-wide
    counter, and a fresh session names them as a new process would ("embedding", not
    "embedding_1"), whatever was built before. Seeded: Keras draws its initial weights from a
    process-wide generator, and a test run should be the same run each time."""
    import keras

    if keras.backend.backend() != "jax":
        import pytest

        pytest.skip("keras is configured for another backend")
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    return keras


def _keras_transformer():
    keras = _fresh_keras()
    inp = keras.Input((SEQ,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, WIDTH)(inp)
    h = keras.layers.LayerNormalization()(h + keras.layers.MultiHeadAttention(4, 8)(h, h))
    f = keras.layers.Dense(WIDTH, activation="gelu")(keras.layers.Dense(64)(h))
    h = keras.layers.LayerNormalization()(h + f)
    model = keras.Model(inp, keras.layers.Dense(VOCAB)(h))
    opt = keras.optimizers.Adam(1e-3)
    opt.build(model.trainable_variables)
    tokens = _tokens()
    return _keras_stateless_step(model, opt, (tokens, np.roll(tokens, -1, axis=1)))


def nnx_cnn():
    """flax.nnx: the MNIST tutorial's CNN (two Conv -> ReLU -> avg_pool stages, two Linear
    layers) on 16x16 RGB images, AdamW through nnx.Optimizer."""
    from functools import partial

    from flax import nnx

    class CNN(nnx.Module):
        def __init__(self, rngs):
            self.conv1 = nnx.Conv(3, 16, kernel_size=(3, 3), rngs=rngs)
            self.conv2 = nnx.Conv(16, 32, kernel_size=(3, 3), rngs=rngs)
            self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
            self.linear1 = nnx.Linear(4 * 4 * 32, 64, rngs=rngs)
            self.linear2 = nnx.Linear(64, CLASSES, rngs=rngs)

        def __call__(self, x):
            x = self.avg_pool(nnx.relu(self.conv1(x)))
            x = self.avg_pool(nnx.relu(self.conv2(x)))
            x = x.reshape(x.shape[0], -1)
            return self.linear2(nnx.relu(self.linear1(x)))

    net = CNN(nnx.Rngs(0))
    opt = nnx.Optimizer(net, optax.adamw(1e-3, 0.9), wrt=nnx.Param)
    graphdef, state = nnx.split((net, opt))

    def step(state, x, y):
        model, optimizer = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(lambda m: _xent(m(x), y))(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    return step, (state, _images(), _labels())


def haiku_transformer():
    """haiku: a two-layer pre-norm decoder (hk.MultiHeadAttention with a causal mask,
    hk.LayerNorm, a GELU MLP, learned positions), as haiku's transformer example writes it;
    Adam with global-norm clipping."""
    import haiku as hk
    import jax.numpy as jnp

    def layer_norm(x):
        return hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(x)

    def forward(tokens):
        x = hk.Embed(VOCAB, WIDTH)(tokens)
        pos = hk.get_parameter("pos", [SEQ, WIDTH], init=hk.initializers.TruncatedNormal(0.02))
        x = x + pos[None, : tokens.shape[1]]
        mask = jnp.tril(jnp.ones((1, 1, tokens.shape[1], tokens.shape[1])))
        for _ in range(2):
            h = layer_norm(x)
            x = x + hk.MultiHeadAttention(num_heads=4, key_size=8,
                                          w_init=hk.initializers.VarianceScaling(1.0))(
                h, h, h, mask=mask)
            h = hk.Linear(WIDTH)(jax.nn.gelu(hk.Linear(4 * WIDTH)(layer_norm(x))))
            x = x + h
        return hk.Linear(VOCAB)(layer_norm(x))

    net = hk.without_apply_rng(hk.transform(forward))
    tokens = _tokens()
    params = net.init(jax.random.key(0), tokens)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(3e-4, b1=0.9, b2=0.99))

    def step(params, opt_state, tokens):
        def loss_fn(p):
            return _xent(net.apply(p, tokens[:, :-1]), tokens[:, 1:])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, (params, tx.init(params), tokens)


def equinox_attention():
    """equinox: a two-block transformer of eqx.nn.MultiheadAttention, eqx.nn.LayerNorm and
    eqx.nn.MLP on one sequence, vmapped over the batch; parameters split with
    eqx.is_inexact_array, AdamW."""
    import equinox as eqx

    class Block(eqx.Module):
        ln1: eqx.nn.LayerNorm
        attn: eqx.nn.MultiheadAttention
        ln2: eqx.nn.LayerNorm
        mlp: eqx.nn.MLP

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.ln1, self.ln2 = eqx.nn.LayerNorm(WIDTH), eqx.nn.LayerNorm(WIDTH)
            self.attn = eqx.nn.MultiheadAttention(4, WIDTH, key=k1)
            self.mlp = eqx.nn.MLP(WIDTH, WIDTH, 2 * WIDTH, 1, key=k2)

        def __call__(self, x):
            h = jax.vmap(self.ln1)(x)
            x = x + self.attn(h, h, h)
            return x + jax.vmap(self.mlp)(jax.vmap(self.ln2)(x))

    class Model(eqx.Module):
        emb: eqx.nn.Embedding
        blocks: list
        head: eqx.nn.Linear

        def __init__(self, key):
            ks = jax.random.split(key, 4)
            self.emb = eqx.nn.Embedding(VOCAB, WIDTH, key=ks[0])
            self.blocks = [Block(ks[1]), Block(ks[2])]
            self.head = eqx.nn.Linear(WIDTH, VOCAB, key=ks[3])

        def __call__(self, tokens):
            x = jax.vmap(self.emb)(tokens)
            for block in self.blocks:
                x = block(x)
            return jax.vmap(self.head)(x)

    model = Model(jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    tx = optax.adamw(1e-3)

    def step(params, opt_state, tokens):
        @eqx.filter_value_and_grad
        def loss_fn(m):
            return _xent(jax.vmap(m)(tokens[:, :-1]), tokens[:, 1:])

        loss, grads = loss_fn(eqx.combine(params, static))
        updates, opt_state = tx.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss

    return step, (params, tx.init(params), _tokens())


def linen_vit():
    """flax.linen: a two-block ViT (4x4 patch conv, class token, learned positions,
    nn.MultiHeadDotProductAttention), SGD with Nesterov momentum."""
    import flax.linen as nn
    import jax.numpy as jnp

    class ViT(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Conv(WIDTH, (4, 4), strides=(4, 4), padding="VALID")(x)
            b, h, w, c = x.shape
            x = x.reshape(b, h * w, c)
            cls = self.param("cls", nn.initializers.zeros, (1, 1, c))
            x = jnp.concatenate([jnp.tile(cls, (b, 1, 1)), x], axis=1)
            x = x + self.param("pos", nn.initializers.normal(0.02), (1, h * w + 1, c))
            for _ in range(2):
                y = nn.LayerNorm()(x)
                x = x + nn.MultiHeadDotProductAttention(num_heads=4)(y, y)
                x = x + nn.Dense(c)(nn.gelu(nn.Dense(2 * c)(nn.LayerNorm()(x))))
            return nn.Dense(CLASSES)(nn.LayerNorm()(x)[:, 0])

    model = ViT()
    images = _images()
    params = model.init(jax.random.key(0), images)
    tx = optax.sgd(0.01, momentum=0.9, nesterov=True)

    def step(params, opt_state, images, labels):
        loss, grads = jax.value_and_grad(lambda p: _xent(model.apply(p, images), labels))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, (params, tx.init(params), images, _labels())


def keras_cnn():
    """Keras 3 on JAX: Conv2D -> BatchNormalization -> ReLU -> MaxPooling2D -> Conv2D ->
    global average pooling -> Dropout -> Dense, AdamW, trained statelessly (see
    keras_transformer)."""
    with jax.numpy_rank_promotion("allow"):
        return _keras_cnn()


def _keras_cnn():
    keras = _fresh_keras()
    inp = keras.Input((16, 16, 3))
    h = keras.layers.BatchNormalization()(keras.layers.Conv2D(16, 3, padding="same")(inp))
    h = keras.layers.MaxPooling2D()(keras.layers.ReLU()(h))
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.Dropout(0.2)(keras.layers.GlobalAveragePooling2D()(h))
    model = keras.Model(inp, keras.layers.Dense(CLASSES)(h))
    opt = keras.optimizers.AdamW(1e-3)
    opt.build(model.trainable_variables)
    return _keras_stateless_step(model, opt, (_images(), _labels()))


def _keras_stateless_step(model, opt, data):
    """(step, args) of a Keras model trained with stateless_call and stateless_apply."""
    import keras

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def compute_loss(trainable, non_trainable, x, y):
        logits, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
        return loss_fn(y, logits), non_trainable

    grad_fn = jax.value_and_grad(compute_loss, has_aux=True)

    def step(state, data):
        with jax.numpy_rank_promotion("allow"):
            trainable, non_trainable, opt_vars = state
            x, y = data
            (loss, non_trainable), grads = grad_fn(trainable, non_trainable, x, y)
            trainable, opt_vars = opt.stateless_apply(opt_vars, grads, trainable)
            return loss, (trainable, non_trainable, opt_vars)

    state = ([v.value for v in model.trainable_variables],
             [v.value for v in model.non_trainable_variables],
             [v.value for v in opt.variables])
    return step, (state, data)


def linen_accumulate():
    """flax.linen: a two-block causal decoder whose step accumulates gradients over four
    micro-batches with `lax.scan` (the batch reshaped to [micro-batches, examples, seq]),
    then clips and applies AdamW once."""
    import flax.linen as nn
    import jax.numpy as jnp

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
            attention = nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=WIDTH)
            x = x + attention(nn.LayerNorm()(x), mask=mask)
            h = nn.Dense(4 * WIDTH)(nn.LayerNorm()(x))
            return x + nn.Dense(WIDTH)(nn.gelu(h))

    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(VOCAB, WIDTH)(tokens)
            for _ in range(2):
                x = Block()(x)
            return nn.Dense(VOCAB)(nn.LayerNorm()(x))

    micro = 4
    model = Decoder()
    tokens = _tokens(shape=(micro * BATCH, SEQ))
    params = model.init(jax.random.key(0), tokens[:2, :-1])
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))

    def step(params, opt_state, tokens):
        def loss_fn(p, batch):
            return _xent(model.apply(p, batch[:, :-1]), batch[:, 1:])

        def accumulate(acc, batch):
            loss, grads = jax.value_and_grad(loss_fn)(params, batch)
            return jax.tree.map(jnp.add, acc, (loss, grads)), None

        zeros = (jnp.zeros(()), jax.tree.map(jnp.zeros_like, params))
        batches = tokens.reshape(micro, -1, tokens.shape[1])
        (loss, grads), _ = jax.lax.scan(accumulate, zeros, batches)
        grads = jax.tree.map(lambda g: g / micro, grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss / micro

    return step, (params, tx.init(params), tokens)


BUILDERS = {
    "linen": (linen_scan_remat, "flax"),
    "nnx": (nnx_dropout_batchnorm, "flax"),
    "equinox": (equinox_filter, "equinox"),
    "haiku": (haiku_resnet, "haiku"),
    "keras": (keras_transformer, "keras"),
    "nnx-cnn": (nnx_cnn, "flax"),
    "haiku-transformer": (haiku_transformer, "haiku"),
    "equinox-attention": (equinox_attention, "equinox"),
    "linen-vit": (linen_vit, "flax"),
    "keras-cnn": (keras_cnn, "keras"),
    "linen-accumulate": (linen_accumulate, "flax"),
}
