"""Names from the field: models from flax.linen, flax.nnx, equinox, haiku, Keras 3 and Hugging
Face Flax, traced without `dim_names`, get the field's words for their classes — batch, seq,
embed, heads, mlp, vocab — from roles and shape patterns; no class or conflict name is
compiler noise (`%`, `iota`, a `_<n>` suffix); the path names stay as former names that plan
files saved with them still load by."""

import functools
import json
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import toast_lab as tl
from tests.third_party import hf
from tests.third_party.models import BUILDERS
from toast_lab.analysis import MINOR_SHARE, find_roles, minor_classes

MESH = tl.Mesh({"data": 4, "model": 2}, device="h100")
NOISE = re.compile(r"%|iota|_\d+$")


def _nnx_rolled_lm():
    """flax.nnx: a one-block causal decoder (nnx.MultiHeadAttention), its labels the tokens
    rolled by one inside the step."""
    from flax import nnx

    class Decoder(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(64, 32, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(4, 32, decode=False, rngs=rngs)
            self.up = nnx.Linear(32, 64, rngs=rngs)
            self.down = nnx.Linear(64, 32, rngs=rngs)
            self.head = nnx.Linear(32, 64, rngs=rngs)

        def __call__(self, tokens):
            x = self.embed(tokens)
            x = x + self.attn(x, mask=nnx.make_causal_mask(tokens))
            x = x + self.down(jax.nn.gelu(self.up(x)))
            return self.head(x)

    model = Decoder(nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.adamw(1e-3)
    tokens = np.random.default_rng(0).integers(0, 64, (8, 16)).astype(np.int32)

    def step(params, opt_state, tokens):
        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(tokens)
            labels = jnp.roll(tokens, -1, axis=1)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, (params, tx.init(params), tokens)


MODELS = {**{name: (b, lib) for name, (b, lib) in BUILDERS.items()},
          **{name: (b, "transformers") for name, b in hf.BUILDERS.items()},
          "nnx-rolled-lm": (_nnx_rolled_lm, "flax")}

# (model, {input path: (dim, name)}): the classes of the batch, sequence, width, heads, MLP and
# vocabulary, found by a parameter or input on them; a name ending in "(" is a prefix (a
# qualified word: `heads(q_proj)`).
EXPECTED = {
    "hf-gpt2": {"input_ids": (0, "batch"), "transformer/wte/embedding": (1, "embed"),
                "h/0/mlp/c_fc/kernel": (0, "mlp"), "transformer/wte/embedding#": (0, "vocab"),
                "h/0/attn/c_attn/kernel": (0, "qkv"), "h/0/attn/c_proj/kernel": (1, "heads(")},
    "hf-llama": {"input_ids": (0, "batch"), "embed_tokens/embedding": (1, "embed"),
                 "0/mlp/up_proj/kernel": (1, "mlp"), "lm_head/kernel": (1, "vocab("),
                 "embed_tokens/embedding#": (0, "vocab("),
                 "0/self_attn/q_proj/kernel": (1, "heads("),
                 "0/self_attn/k_proj/kernel": (1, "kv_heads(")},
    "hf-bert": {"input_ids": (0, "batch"), "labels": (1, "seq"),
                "word_embeddings/embedding": (1, "embed"),
                "0/intermediate/dense/kernel": (1, "mlp"),
                "word_embeddings/embedding#": (0, "vocab"),
                "0/attention/self/query/kernel": (1, "heads(")},
    "linen": {"tokens": (0, "batch"), "Embed_0/embedding": (1, "embed"),
              "blocks/up/kernel": (2, "mlp"), "params/head/kernel": (1, "vocab("),
              "blocks/up/kernel#": (0, "layers")},
    "nnx-rolled-lm": {"tokens": (0, "batch"), "embed/embedding": (1, "embed"),
                      "up/kernel": (1, "mlp"), "head/kernel": (1, "vocab("),
                      "attn/query/kernel": (1, "heads"),
                      "attn/query/kernel#": (2, "head_dim(")},
    "equinox-attention": {"tokens": (0, "batch"), "blocks/0/ln1/weight": (0, "embed"),
                          "blocks/0/mlp/layers/0/weight": (0, "mlp"),
                          "params/head/weight": (0, "vocab("),
                          "attn/query_proj/weight": (0, "heads(")},
    "haiku-transformer": {"tokens": (0, "batch"), "embed/embeddings": (1, "embed"),
                          "params/linear/w": (0, "mlp("), "linear_4/w": (1, "vocab("),
                          "multi_head_attention/query/w": (1, "heads(")},
    "keras": {"data/0": (0, "batch"), "data/1": (1, "seq"), "state/0/0": (1, "embed"),
              "state/0/1": (1, "heads"), "state/0/0#": (0, "vocab")},
    "nnx": {"x": (0, "batch"), "l1/kernel": (0, "features"), "l1/kernel#": (1, "mlp"),
            "l2/kernel": (1, "logits")},
    "equinox": {"x": (0, "batch"), "layers/0/weight": (1, "features"),
                "layers/0/weight#": (0, "mlp"), "layers/1/weight": (0, "logits")},
    "haiku": {"images": (0, "batch"), "images#": (1, "height("), "images##": (2, "width("),
              "block_group_3/~/block_0/~/conv_0/w": (3, "channels("),
              "initial_conv/w": (0, "kernel_height("), "logits/w": (1, "logits")},
    "keras-cnn": {"data/0": (0, "batch"), "state/0/0": (3, "channels("),
                  "data/0#": (1, "height(")},
    "linen-vit": {"images": (0, "batch"), "params/pos": (1, "seq"),
                  "Conv_0/kernel": (3, "channels"), "MultiHeadDotProductAttention_0/query/kernel":
                  (1, "heads"), "MultiHeadDotProductAttention_0/query/kernel#": (2, "head_dim(")},
}


@functools.cache
def analysed(name):
    builder, module = MODELS[name]
    pytest.importorskip(module)
    with jax.numpy_rank_promotion("allow"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' Flax deprecation
        fn, args = builder()
        return fn, args, tl.analyze(tl.trace(fn, *args))


def _class_of(an, path: str, dim: int):
    prog = an.program
    path = path.rstrip("#")
    v = next(v for v, n in zip(prog.inputs, prog.input_names)
             if (n == path or n.endswith("/" + path) or n.startswith(path + "/")
                 or f"/{path}/" in n) and "opt_state" not in n)
    return an.class_of(v, dim)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_roles_and_patterns_name_classes_as_the_field_does(name):
    _, _, an = analysed(name)
    for path, (dim, want) in EXPECTED[name].items():
        got = _class_of(an, path, dim).name
        ok = got.startswith(want) if want.endswith("(") else got == want
        assert ok, f"{name}: {path}[{dim}] is {got!r}, not {want!r}"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_no_decision_has_a_compiler_name(name):
    _, _, an = analysed(name)
    names = [c.name for c in an.classes] + [c.name for c in an.conflicts]
    assert len(set(names)) == len(names), names
    for n in names:
        assert not NOISE.search(n), f"{name}: {n!r}"
        assert not re.search(r"(^|/)arg\d", n), f"{name}: {n!r}"


@pytest.mark.parametrize("name", ["hf-gpt2", "hf-llama", "linen", "equinox-attention",
                                  "haiku-transformer", "nnx-rolled-lm"])
def test_labels_shifted_inside_the_step_are_the_sequence(name):
    _, _, an = analysed(name)
    roles = find_roles(an)
    assert roles.sequence is not None
    assert an.classes[roles.sequence].name == "seq"
    # sequence parallelism applies where the positions left after the shift divide over the
    # mesh (the Hugging Face steps'); elsewhere it says why not
    experts = tl.strategies.expert(an, MESH)
    assert "sp" in experts or "cannot be split" in experts.skipped["sp"], experts.skipped
    if name.startswith("hf-"):
        assert "sp" in experts, experts.skipped


def test_names_are_deterministic():
    fn, args, an = analysed("hf-llama")
    with jax.numpy_rank_promotion("allow"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        again = tl.analyze(tl.trace(fn, *args))
    assert [c.name for c in again.classes] == [c.name for c in an.classes]
    assert [c.name for c in again.conflicts] == [c.name for c in an.conflicts]


def test_path_names_and_origins_still_name_their_classes():
    _, _, an = analysed("hf-llama")
    embed = an.class_named("embed")
    assert embed.formerly[0] == "lm_head/kernel[0]"
    assert an.class_named("lm_head/kernel[0]") is embed
    assert an.class_named("params/lm_head/kernel[0]") is embed  # its origin
    for c in an.classes:
        for old in c.formerly:
            assert an.class_named(old) is c or old in {k.name for k in an.classes}


def test_a_plan_file_saved_with_path_names_loads(tmp_path):
    _, _, an = analysed("hf-gpt2")
    plan = (tl.Plan.replicated(an).with_axes("batch", ("data",)).with_axes("mlp", ("model",))
            .with_axes("seq", ("model",)))
    conflict = next(c for c in an.conflicts if c.class_name == "seq")
    plan = plan.with_resolution(conflict.name, conflict.resolutions[0])
    path = tmp_path / "plan.json"
    plan.save(path, mesh=MESH)
    saved = json.loads(path.read_text())
    old = {c.name: c.formerly[0] for c in an.classes if c.formerly}
    assert old["batch"] == "input_ids[0]" and old["mlp"] == "c_fc/bias[0]"
    saved["classes"] = {old.get(k, k): v for k, v in saved["classes"].items()}
    saved["conflicts"] = {old["seq"] + k[len("seq"):]: v for k, v in saved["conflicts"].items()}
    saved["pinned"] = [old.get(k, k) for k in saved.get("pinned", [])]
    old_file = tmp_path / "old.json"
    old_file.write_text(json.dumps(saved))
    loaded = tl.Plan.load(old_file, an)
    assert loaded.axes_of("batch") == ("data",) and loaded.axes_of("mlp") == ("model",)
    assert loaded.conflict_resolutions == plan.conflict_resolutions


def test_minor_classes_are_those_with_almost_nothing_at_stake():
    _, _, an = analysed("hf-llama")
    top = max(c.bytes for c in an.classes)
    minor = minor_classes(an)
    assert minor and {c.id for c in minor} == {c.id for c in an.classes if c.minor}
    assert all(c.bytes < MINOR_SHARE * top for c in minor)
    assert not any(an.class_named(n).minor for n in ("batch", "seq", "embed", "mlp", "heads"))
    assert any(c.minor for c in an.classes if c.name.startswith("head_dim(rotary_emb"))
    assert minor_classes(an, share=0.0) == ()
    assert [c.bytes for c in minor] == sorted((c.bytes for c in minor), reverse=True)


def test_argument_names_come_from_the_signature():
    def step(w, *batch):
        x, y = batch
        return ((x @ w - y) ** 2).sum()

    w = jax.ShapeDtypeStruct((16, 4), jnp.float32)
    x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    y = jax.ShapeDtypeStruct((8, 4), jnp.float32)
    prog = tl.trace(step, w, x, y)
    assert list(prog.input_names) == ["w", "batch/0", "batch/1"]
    bound = tl.trace(jax.jit(functools.partial(lambda scale, w, x: (x @ w).sum() * scale, 2.0)),
                     w, x)
    assert list(bound.input_names) == ["w", "x"]
