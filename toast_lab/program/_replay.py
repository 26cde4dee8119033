"""Replay a traced Program, op by op (re-binding each primitive), optionally transforming
chosen values.

Export uses it to put `with_sharding_constraint` exactly where a plan must hold XLA to a
choice (DESIGN.md §8), including inside scan / while / cond bodies, whose jaxprs are rebuilt
around the transformed body. The walk is `jax.core.eval_jaxpr`'s: an env dict, read, write.
`Replay` is that walk as a class whose hooks a rewrite of the step overrides (plan.jit's
remat and micro-batches: plan/_step_replay.py).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax

from ._program import Program

# transform(value_id, array) -> array; called on each value in `transform_values` once defined.
Transform = Callable[[int, Any], Any]
# use_transform(op_id, operand_index, array) -> array; called on the operands in `use_targets`
# just before their op reads them (the value itself is unchanged for other readers).
UseTransform = Callable[[int, int, Any], Any]


def replay(program: Program, flat_args, transform: Transform | None = None,
             transform_values: frozenset[int] = frozenset(),
             use_transform: UseTransform | None = None,
             use_targets: frozenset[tuple[int, int]] = frozenset()):
    """The program's flat outputs for flat inputs (in `program.inputs` order)."""
    return Replay(program, transform, transform_values, use_transform, use_targets)(flat_args)


def as_function(program: Program, transform: Transform | None = None,
                transform_values: frozenset[int] = frozenset(),
                use_transform: UseTransform | None = None,
                use_targets: frozenset[tuple[int, int]] = frozenset(),
                runner: "Replay | None" = None) -> Callable:
    """A function with the traced function's calling convention: f(*args, **kwargs) -> out.
    runner: the Replay to run (a rewrite's); default one with the transforms given."""
    run = runner if runner is not None else Replay(program, transform, transform_values,
                                                   use_transform, use_targets)

    def fn(*args, **kwargs):
        flat, tree = jax.tree_util.tree_flatten((args, kwargs))
        if tree != program.in_tree:
            raise TypeError(f"expected arguments shaped like {program.in_tree}, got {tree}")
        return jax.tree_util.tree_unflatten(program.out_tree, run(flat))

    fn.__name__ = program.fn_name
    return fn


def _bind(primitive, args, params) -> list:
    """The results of one equation, as a list: `eval_jaxpr`'s re-bind.

    Some primitives keep sub-jaxprs in their params in a form `bind` does not take
    (`shard_map`'s body, call primitives): `get_bind_params` turns them back into what `bind`
    expects (jax/_src/core.py `eval_jaxpr`). Since jax 0.8 it returns the bind params with the
    sub-functions under 'subfuns'; before, a (subfuns, params) pair.
    """
    bind_params = primitive.get_bind_params(params)
    if isinstance(bind_params, tuple):
        subfuns, bind_params = bind_params
        outs = primitive.bind(*subfuns, *args, **bind_params)
    else:
        outs = primitive.bind(*args, **bind_params)
    return list(outs) if primitive.multiple_results else [outs]


class Replay:
    """Runs a Program's ops on arrays, op by op: `jax.core.eval_jaxpr`'s walk (an env dict
    from value id to array), transforming chosen values as it writes them (`transform` on
    `transform_values`) and chosen operands as their op reads them (`use_transform` on
    `use_targets`, (op id, operand index) pairs).

    A rewrite of the program subclasses it and overrides the hooks: `before(env, op)` runs
    just before a top-level op, `bind(op, args)` computes one non-region op, `region(op,
    args)` one region op with its bodies. `run(env, start, stop)` walks the ops in [start,
    stop) at one level (a region op stands for its body ops), `run_ops(env, ids)` the listed
    ones; `replay(flat_args)` (also the instance's `__call__`) the whole program.
    """

    def __init__(self, program, transform=None, transform_values=frozenset(),
                 use_transform=None, use_targets=frozenset()):
        self.program = program
        self.transform = transform
        self.targets = transform_values if transform is not None else frozenset()
        self.use_transform = use_transform
        self.use_targets = use_targets if use_transform is not None else frozenset()
        self.use_ops = {o for o, _ in self.use_targets}
        # Region ops whose bodies hold a target: those bodies are rebuilt.
        self.rebuild = {op.id for op in program.ops
                        if op.body and any(self._touches(i) for i in range(*op.body_ops))}

    def __call__(self, flat_args) -> list:
        program = self.program
        env: dict[int, Any] = self.body_env()
        env.update(zip(program.inputs, flat_args))
        self.run(env, 0, len(program.ops))
        return [env[v] for v in program.outputs]

    def _touches(self, i: int) -> bool:
        op = self.program.ops[i]
        return i in self.use_ops or any(r in self.targets for r in op.results)

    def write(self, env, vid, x):
        if vid in self.targets:
            x = self.transform(vid, x)
        env[vid] = x

    def run(self, env: dict, start: int, stop: int) -> None:
        ops = self.program.ops
        i = start
        while i < stop:
            self.step(env, ops[i])
            i = ops[i].body_ops[1] if ops[i].body else i + 1

    def run_ops(self, env: dict, op_ids) -> None:
        for i in op_ids:
            self.step(env, self.program.ops[i])

    def step(self, env: dict, op) -> None:
        """Runs one op (a region op with its bodies) and writes its results."""
        self.before(env, op)
        args = self.operands(env, op)
        outs = self.region(op, args) if op.body else self.bind(op, args)
        for vid, x in zip(op.results, outs):
            self.write(env, vid, x)

    def operands(self, env: dict, op) -> list:
        """The op's operands as it reads them (`use_transform` applied)."""
        args = [env[v] for v in op.operands]
        if op.id in self.use_ops:
            args = [self.use_transform(op.id, t, x) if (op.id, t) in self.use_targets else x
                    for t, x in enumerate(args)]
        return args

    def before(self, env: dict, op) -> None:
        """A hook: runs before `op` reads its operands."""

    def bind(self, op, args, params=None) -> list:
        """One non-region op's results; `params` instead of the traced ones where given."""
        return _bind(op.jax_primitive, args, op.params if params is None else params)

    def body_env(self) -> dict:
        """What every body's env starts from: the program's constants."""
        return dict(self.program.constants)

    def region(self, op, args) -> list:
        return self._region(op, args)

    def body(self, op, k: int, inputs, outputs, values) -> list:
        """Runs body `k` of region op `op` with its `inputs` (value ids) bound to `values`;
        returns the `outputs` (value ids)."""
        env = self.body_env()
        env.update(zip(inputs, values))
        self.run(env, *op.body_ranges[k])
        return [env[v] for v in outputs]

    def lax_region(self, op, args) -> list:
        """The region op run through jax.lax's own scan / while_loop / switch, its bodies
        replayed by this Replay (so a rewrite's hooks and shapes hold inside), not bound to
        the jaxprs it was traced with. A while loop's predicate is its traced cond jaxpr."""
        name, body, params = op.primitive, op.body, op.params
        if name == "scan":
            nc, nk, n_in = params["num_consts"], params["num_carry"], len(op.operands)
            consts = args[:nc]

            def step(carry, x):
                outs = self.body(op, 0, body[:n_in], body[n_in:], (*consts, *carry, *x))
                return tuple(outs[:nk]), tuple(outs[nk:])

            carry, ys = jax.lax.scan(step, tuple(args[nc:nc + nk]), tuple(args[nc + nk:]),
                                     length=params["length"], reverse=params["reverse"],
                                     unroll=params.get("unroll", 1))
            return [*carry, *ys]
        if name == "while":
            cc, bc, n = params["cond_nconsts"], params["body_nconsts"], len(op.results)
            cond = params["cond_jaxpr"]
            body_in, body_out = body[cc + n:cc + n + bc + n], body[cc + n + bc + n:]

            def keep_going(carry):
                return jax.core.eval_jaxpr(cond.jaxpr, cond.consts, *args[:cc], *carry)[0]

            def step(carry):
                return tuple(self.body(op, 1, body_in, body_out, (*args[cc:cc + bc], *carry)))

            return list(jax.lax.while_loop(keep_going, step, tuple(args[cc + bc:])))
        m, k = len(args) - 1, len(op.results)

        def branch(b):
            base = b * (m + k)
            return lambda *xs: self.body(op, b, body[base:base + m],
                                         body[base + m:base + m + k], xs)

        return list(jax.lax.switch(args[0], [branch(b) for b in range(len(op.body_ranges))],
                                   *args[1:]))

    def _region(self, op, args):
        params: Mapping = op.params
        if op.id in self.rebuild:
            params = dict(params, **self._rebuilt_bodies(op))
        if "ft_in" in params:  # JAX >= 0.11's scan: drop the counts the trace added
            params = {k: v for k, v in params.items() if k not in ("num_consts", "num_carry")}
        return _bind(op.jax_primitive, args, params)

    def _rebuilt_bodies(self, op) -> dict:
        """New body jaxprs for a region op, with the transform applied inside."""
        name = op.primitive
        if name == "scan":
            old = [op.params["jaxpr"]]
        elif name == "while":
            old = [op.params["cond_jaxpr"], op.params["body_jaxpr"]]
        else:
            old = list(op.params["branches"])
        # The body value ids laid out by _trace: split them per body again.
        bodies, pos = [], 0
        n_in = [len(c.jaxpr.invars) for c in old]
        n_out = [len(c.jaxpr.outvars) for c in old]
        if name == "cond":
            for ni, no in zip(n_in, n_out):
                bodies.append((op.body[pos:pos + ni], op.body[pos + ni:pos + ni + no]))
                pos += ni + no
        else:
            ins = []
            for ni in n_in:
                ins.append(op.body[pos:pos + ni])
                pos += ni
            outs_scan = op.body[pos:]
            if name == "scan":
                bodies = [(ins[0], outs_scan)]
            else:  # while: the cond's output (its predicate) is not in the boundary
                bodies = [(ins[0], None), (ins[1], outs_scan)]
        new = []
        for closed, (body_in, body_out), rng in zip(old, bodies, op.body_ranges):
            if body_out is None or not any(self._touches(k) for k in range(*rng)):
                new.append(closed)
                continue

            def body_fn(*xs, body_in=body_in, body_out=body_out, rng=rng):
                env = self.body_env()
                env.update(zip(body_in, xs))
                self.run(env, *rng)
                return [env[v] for v in body_out]

            rebuilt = jax.make_jaxpr(body_fn)(*[v.aval for v in closed.jaxpr.invars])
            # Region params expect bodies closed over the same constants; keep the old body
            # (unconstrained) rather than change the calling convention.
            new.append(closed if rebuilt.consts else rebuilt)
        if name == "scan":
            return {"jaxpr": new[0]}
        if name == "while":
            return {"cond_jaxpr": new[0], "body_jaxpr": new[1]}
        return {"branches": tuple(new)}
