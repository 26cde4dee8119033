"""The model zoo: small, plain-JAX training steps to partition.

Every model is a whole training step, `step(params, opt_state, batch) -> (params, opt_state,
loss)`, with AdamW from optax::

    fn, args = toast_lab.zoo.get("gpt", layers=2)      # args: ShapeDtypeStruct pytrees
    concrete = toast_lab.zoo.sample("gpt", seed=0, layers=2)
    params, opt_state, loss = jax.jit(fn)(*concrete)

`fn.dim_names` has one entry per positional argument: a pytree shaped like that argument whose
leaves are plain tuples of logical dim names (`str | None`, one per dim of the leaf), e.g.
`("embed", "heads", "head_dim")`. Walk it alongside the argument with the argument first,
`jax.tree.map(f, args[i], fn.dim_names[i])`, so each name tuple arrives whole. All three
arguments are named: AdamW's moments take their params' names, its step count `()`.
`fn.config` is the resolved config.

Models: `mlp`, `gpt`, `gpt_scan`, `cnn`, `moe`, `gnn`, `llama`; see each module's docstring
for shapes.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import optax

from ._cnn import CNN
from ._common import Model, make_step, opt_state_names
from ._gnn import GNN
from ._gpt import GPT, GPT_SCAN
from ._llama import LLAMA
from ._mlp import MLP
from ._moe import MOE

_MODELS: dict[str, Model] = {m.name: m for m in (MLP, GPT, GPT_SCAN, CNN, MOE, GNN, LLAMA)}

__all__ = ["config", "get", "names", "sample"]


def names() -> tuple[str, ...]:
    """The zoo's model names, in a fixed order."""
    return tuple(_MODELS)


def _model(name: str) -> Model:
    if name not in _MODELS:
        raise KeyError(f"No zoo model {name!r}. Models: {', '.join(_MODELS)}.")
    return _MODELS[name]


def config(name: str, **overrides) -> Any:
    """The resolved config of model `name` (a frozen dataclass): defaults, then the `size=`
    preset where the model has presets, then `overrides`. Unknown keys raise `TypeError`."""
    return _model(name).make_config(**overrides)


def _optimizer(cfg) -> optax.GradientTransformation:
    return optax.adamw(cfg.learning_rate, weight_decay=cfg.weight_decay)


def get(name: str, **overrides) -> tuple[Callable, tuple]:
    """`(step, args)` for model `name`: the training step and its abstract arguments
    `(params, opt_state, batch)` as `jax.ShapeDtypeStruct` pytrees (nothing is allocated)."""
    model = _model(name)
    cfg = model.make_config(**overrides)
    opt = _optimizer(cfg)
    step = make_step(model, cfg, opt)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), cfg))
    opt_state = jax.eval_shape(opt.init, params)
    batch = jax.eval_shape(lambda: model.batch(jax.random.key(0), cfg))
    param_names = model.param_names(cfg)
    step.dim_names = (
        param_names,
        opt_state_names(opt, opt_state, param_names),
        model.batch_names(cfg),
    )
    step.config = cfg
    return step, (params, opt_state, batch)


def sample(name: str, seed: int = 0, **overrides) -> tuple:
    """Concrete `(params, opt_state, batch)` for model `name`, shaped like `get`'s `args`:
    initialized params, a fresh AdamW state and a random batch with valid integer ranges."""
    model = _model(name)
    cfg = model.make_config(**overrides)
    opt = _optimizer(cfg)

    def draw(key):
        k_params, k_batch = jax.random.split(key)
        params = model.init(k_params, cfg)
        return params, opt.init(params), model.batch(k_batch, cfg)

    # One program, compiled without XLA's backend optimizations: the random-number kernels
    # (one threefry per leaf) otherwise take seconds to compile on CPU for a run of microseconds.
    draw = jax.jit(draw, compiler_options={"xla_backend_optimization_level": 0})
    return draw(jax.random.key(seed))
