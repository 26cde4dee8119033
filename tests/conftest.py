"""Test setup: JAX on 8 simulated CPU devices, in strict mode where JAX has one.

The device count must be set before JAX initializes its backends, so it lives here, at import.
"""

import os
import sys
import textwrap

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("KERAS_BACKEND", "jax")  # tests/third_party's Keras model runs on JAX
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(scope="module")
def tiny_gpt():
    """(analysis, mesh): the zoo's tiny 3-layer GPT on data=4 x model=2 H100s, once per
    module (the Lab's and the plan display's tests draw it)."""
    import toast_lab as tl

    fn, args = tl.zoo.get("gpt", size="tiny", layers=3)
    return tl.analyze(tl.trace(fn, *args)), tl.Mesh({"data": 4, "model": 2}, device="h100")


# User modules for the CLI's `module:function` targets (tests/test_cli.py, test_lab_cli.py).
@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "usersteps.py").write_text(textwrap.dedent("""
        import jax, jax.numpy as jnp

        def bare(w, x):
            return (x @ w).sum()

        def step(w, x):
            return jnp.tanh(x @ w).sum()

        step.example_args = (jax.ShapeDtypeStruct((16, 32), jnp.float32),
                             jax.ShapeDtypeStruct((8, 16), jnp.float32))

        def factory(width=16):
            return step, (jax.ShapeDtypeStruct((16, width), jnp.float32),
                          jax.ShapeDtypeStruct((8, 16), jnp.float32))

        def broken(w, x):
            return w @ w

        broken.example_args = step.example_args

        def lazy_fails(w, x):
            return (x @ w).sum()

        lazy_fails.example_args = lambda: 1 / 0

        def factory_fails(width=16):
            raise ValueError(f"width {width} is not a multiple of 8")
    """))
    (tmp_path / "importfails.py").write_text("WIDTH = 1 / 0\n")
    (tmp_path / "syntaxfails.py").write_text("def step(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in ("usersteps", "importfails", "syntaxfails"):
        sys.modules.pop(name, None)
