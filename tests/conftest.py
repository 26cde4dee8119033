"""Test setup: JAX on 8 simulated CPU devices, in strict mode where JAX has one.

The device count must be set before JAX initializes its backends, so it lives here, at import.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("KERAS_BACKEND", "jax")  # tests/third_party's Keras model runs on JAX
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
