"""Small training steps written with other people's libraries (flax.linen, flax.nnx, equinox,
haiku, Keras 3 on JAX), for tests that bring their own step. Each builder returns
`(step, args)` with concrete, valid arguments; the libraries come from the `test` extra."""
