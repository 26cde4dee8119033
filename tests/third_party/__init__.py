"""Small training steps written with other people's libraries (flax.linen, flax.nnx, equinox,
haiku, Keras 3 on JAX), for tests that bring their own step. Each builder returns
`(step, args)` with concrete, valid arguments; the libraries come from the `test` extra."""

import warnings


def traced(builders: dict, name: str):
    """(step, args, analysis) of builder `name` of `builders` ({name: (builder, the module it
    needs)}), skipped where that library is not installed; traced with ToastWarning an error:
    every op has a rule that maps it."""
    import pytest

    import toast_lab as tl

    builder, module = builders[name]
    pytest.importorskip(module)
    fn, args = builder()
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.ToastWarning)
        an = tl.analyze(tl.trace(fn, *args))
    return fn, args, an
