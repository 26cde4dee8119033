"""plan.jit's replay of a step with its decisions beyond sharding (plan/_decisions.py): the
traced program re-run op by op, its layer groups recomputed in the backward pass as their
remat policies say (plan/_remat.py), its batch split into micro-batches by a `lax.scan` that
accumulates the sums over the batch (analysis/_micro_batching.py), and the plan's sharding
constraints applied everywhere the plain replay applies them, inside the loop too.

The micro-batch loop: the ops that do not depend on the batch run once before it; the inputs
that carry the batch are cut into k micro-batches of B/k examples (example i goes to
micro-batch i mod k, so each device keeps its own examples: the data-parallel shards of the
batch are cut in place); each iteration replays the per-example ops at the micro-batch's
shapes (rules/_resize.py rewrites the params that name sizes) and adds its sums into the
accumulators, float32 for lower-precision floats; the ops after the sums (the optimizer's
update) run once after it, on the accumulated sums.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ..program import CONST, NO_OP, Replay, as_function
from ..rules import Shapes, resized_params
from ._pipeline import PipelinedScans, stack_pipeline
from ._remat import remat_rewrite


class StepReplay(PipelinedScans, Replay):
    """A Replay of `program` (the plan's, or one of the same structure) that applies
    `plan.step` (module docstring).

    constrain(value id, array) / gather(op, operand index, array): the plan's sharding
    constraints (plan/_export.py's), on `targets` / `uses`. spec(value id): the plan's
    PartitionSpec of a value, for the accumulators and the cut inputs.
    """

    def __init__(self, plan, program, jax_mesh, constrain, targets, gather, uses, spec):
        super().__init__(program, constrain, targets, gather, uses)
        an = plan.analysis
        self.mesh, self.spec = jax_mesh, spec
        self.count = plan.step.micro_batches
        pipeline = plan.step.pipeline
        self.pipe = stack_pipeline(an, pipeline) if pipeline is not None else None
        # micro-batches run through the pipeline's stages, or accumulate around the whole step
        self.split = an.micro_batching if self.count > 1 or self.pipe else None
        self.accumulate = self.count > 1 and self.pipe is None
        self.remat = remat_rewrite(an, plan.step)
        self.micro = False        # replaying the per-example ops of one micro-batch
        self.recomputing = False  # replaying a group's forward ops in the backward pass
        self.cut_constants: dict[int, object] = {}  # this micro-batch's slice of constants

    # --- the whole step -----------------------------------------------------------------

    def __call__(self, flat_args) -> list:
        prog = self.program
        env = self.body_env()
        env.update(zip(prog.inputs, flat_args))
        if not self.accumulate:
            self.run(env, 0, len(prog.ops))
        else:
            self._micro_batches(env)
        return [env[v] for v in prog.outputs]

    def _micro_batches(self, env: dict) -> None:
        split, k, prog = self.split, self.count, self.program
        self.run_ops(env, split.pre_ops)
        cut = [v for v, _ in split.split]
        xs = [self._cut(v, d, env[v]) for v, d in split.split]
        sums = [self._zeros(v) for v in split.accumulated]

        def one(acc, x):
            inner = dict(env)
            inner.update(zip(cut, x))
            self.cut_constants = {v: a for v, a in zip(cut, x)
                                  if prog.values[v].origin == CONST}
            self.micro = True
            try:
                self.run_ops(inner, split.loop_ops)
            finally:
                self.micro, self.cut_constants = False, {}
            acc = [self._place(v, a + inner[v].astype(a.dtype))
                   for v, a in zip(split.accumulated, acc)]
            return acc, [inner[v] for v in split.stacked]

        sums, stacks = jax.lax.scan(one, sums, xs, length=k)
        for v, a in zip(split.accumulated, sums):
            env[v] = a.astype(prog.values[v].dtype)
        for v, y in zip(split.stacked, stacks):
            env[v] = self._uncut(v, y)
        self.run_ops(env, split.post_ops)

    def _cut(self, v: int, d: int, x):
        """[..., B, ...] (batch at dim d) -> [k, ..., B/k, ...]: example i to micro-batch
        i mod k."""
        k, shape = self.count, x.shape
        x = x.reshape(shape[:d] + (shape[d] // k, k) + shape[d + 1:])
        x = jnp.moveaxis(x, d + 1, 0)
        entries = _entries(self.spec(v), len(shape))
        return self._constrained(x, PartitionSpec(None, *entries))

    def _uncut(self, v: int, y):
        (d,) = self.split.batch_dims[v]
        y = jnp.moveaxis(y, 0, d + 1)
        shape = self.program.values[v].shape
        return self._place(v, y.reshape(shape))

    def _zeros(self, v: int):
        dtype = np.dtype(self.program.values[v].dtype)
        if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4:
            dtype = np.dtype(np.float32)  # bfloat16 sums of sums lose the small ones
        return self._place(v, jnp.zeros(self.program.values[v].shape, dtype))

    def _place(self, v: int, x):
        return self._constrained(x, self.spec(v))

    def _constrained(self, x, spec):
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

    # --- per op ---------------------------------------------------------------------------

    def operands(self, env: dict, op) -> list:
        aliases = self.remat.aliases
        barred = op.cse_group in self.remat.user_checkpoints
        if not barred and (not aliases or op.region != NO_OP):
            return super().operands(env, op)
        read = {}
        for v in op.operands:
            v_read = aliases.get(v, v) if op.region == NO_OP else v
            read[v] = env.get(("barrier", op.cse_group, v_read), env.get(v_read)) if barred \
                else env[v_read]
        return super().operands(read, op)

    def body_env(self) -> dict:
        env = super().body_env()
        env.update(self.cut_constants)
        return env

    def bind(self, op, args, params=None) -> list:
        if not self.micro:
            return super().bind(op, args, params)
        prog, k = self.program, self.count
        old = Shapes(tuple(prog.values[v].shape for v in op.operands),
                     tuple(prog.values[v].shape for v in op.results))
        new = Shapes(tuple(tuple(np.shape(a)) for a in args),
                     tuple(self.split.shape(r, prog.values[r].shape, k) for r in op.results))
        outs = super().bind(op, args, resized_params(op.primitive, op.params, old, new))
        got = tuple(tuple(np.shape(x)) for x in outs)
        if got != new.results:  # the analysis allowed it: a resize rule is wrong
            raise AssertionError(f"{op.primitive} at {op.source} ran on a micro-batch with "
                                 f"shapes {got}, expected {new.results}")
        return outs

    def region(self, op, args) -> list:
        if self.micro:
            return self.lax_region(op, args)
        return super().region(op, args)

    # --- remat ----------------------------------------------------------------------------

    def before(self, env: dict, op) -> None:
        for unit in self.remat.units.get(op.id, ()):
            self._recompute(env, unit)
        first, reads = self.remat.user_checkpoints.get(op.cse_group, (None, ()))
        if op.id == first:  # a user's checkpoint: its recomputation reads through a barrier
            barred = jax.lax.optimization_barrier([env[v] for v in reads])
            env.update(((("barrier", op.cse_group, v), x) for v, x in zip(reads, barred)))

    def _recompute(self, env: dict, unit) -> None:
        leaves, _ = jax.lax.optimization_barrier(
            ([env[v] for v in unit.leaves], [env[v] for v in unit.cotangents]))
        scratch = dict(env)
        scratch.update(zip(unit.leaves, leaves))
        self.recomputing = True
        try:
            self.run_ops(scratch, unit.ops)
        finally:
            self.recomputing = False
        for r in unit.recomputed:
            env[r] = scratch[r]

    def step(self, env: dict, op) -> None:
        if op.id in self.remat.dead:  # a user's recomputation the plan overrides
            return None
        if self.pipe is not None and op.id in (self.pipe.forward, self.pipe.backward):
            return self._pipelined(env, op)
        scan = self.remat.scans.get(op.id)
        if scan is None:
            return super().step(env, op)
        self.before(env, op)
        # (a region op reads its operands as they are; the dropped stacks were never made)
        args = [env.get(v) for v in op.operands]
        if op.id == scan.forward:
            outs, env[("stacks", op.id)] = self._forward_scan(op, args, scan)
        else:
            outs = self._backward_scan(env, op, args, scan)
        for vid, x in zip(op.results, outs):
            if x is not None:
                self.write(env, vid, x)

    def _forward_scan(self, op, args, scan):
        """The forward scan without the dropped stacks, writing the emitted ones: (its
        results, None where dropped; the emitted stacks)."""
        nc, nk = op.params["num_consts"], op.params["num_carry"]
        kept = self.kept_results(op, scan)
        carry, ys = self._scan(op, self.forward_layer(op, scan, args[:nc]), args[nc:nc + nk],
                               args[nc + nk:])
        made = dict(zip(kept, [*carry, *ys[:len(kept) - nk]]))
        return [made.get(j) for j in range(len(op.results))], list(ys[len(kept) - nk:])

    @staticmethod
    def kept_results(op, scan) -> list[int]:
        """Positions of the forward scan's results a remat `scan` keeps (all without one)."""
        return [j for j, r in enumerate(op.results) if scan is None or r not in scan.dropped]

    def forward_layer(self, op, scan, consts):
        """The forward scan's body, one layer: (carry, xs slices) -> (carry, the kept results'
        slices, then the values remat `scan` emits for the recomputation)."""
        nk, n_in = op.params["num_carry"], len(op.operands)
        f_in, f_out = op.body[:n_in], op.body[n_in:]
        wanted = [f_out[j] for j in self.kept_results(op, scan)]
        wanted += list(scan.emitted) if scan is not None else []

        def one(carry, x):
            outs = self.body(op, 0, f_in, wanted, (*consts, *carry, *x))
            return tuple(outs[:nk]), tuple(outs[nk:])

        return one

    @staticmethod
    def backward_xs(op, scan) -> list[int]:
        """Positions of the backward scan's xs operands it still reads under remat `scan`
        (then come the emitted stacks and the forward scan's own stacks)."""
        nc, nk = op.params["num_consts"], op.params["num_carry"]
        return [p for p in range(nc + nk, len(op.operands))
                if scan is None or op.operands[p] not in scan.dropped]

    def backward_layer(self, op, scan, consts, fwd_consts):
        """The backward scan's body, one layer: (carry, x) -> (carry, ys); x: the slices of
        `backward_xs`, then (under remat `scan`) of the emitted stacks and the forward scan's
        stacks, from which it first recomputes the layer's dropped residuals, through one
        barrier with its carried cotangents."""
        nc, nk = op.params["num_consts"], op.params["num_carry"]
        b_in, b_out = op.body[:len(op.operands)], op.body[len(op.operands):]
        xs_at = self.backward_xs(op, scan)
        if scan is None:
            def plain(carry, x):
                outs = self.body(op, 0, b_in, b_out, (*consts, *carry, *x))
                return tuple(outs[:nk]), tuple(outs[nk:])
            return plain
        leaf_ids = ([w for _, w in scan.kept_leaves] + list(scan.emitted)
                    + [w for _, w in scan.stacks] + [w for _, w in scan.consts])

        def one(carry, x):
            mine = x[:len(xs_at)]
            slices = dict(zip((b_in[p] for p in xs_at), mine))
            values = ([slices[b] for b, _ in scan.kept_leaves] + list(x[len(xs_at):])
                      + list(fwd_consts))
            values, carry = jax.lax.optimization_barrier((values, carry))
            again = self.body_env()
            again.update(zip(leaf_ids, values))
            self.recomputing = True
            try:
                self.run_ops(again, scan.recompute_ops)
            finally:
                self.recomputing = False
            bound = dict(zip(b_in[:nc], consts))
            bound.update(zip(b_in[nc:nc + nk], carry))
            bound.update(slices)
            bound.update((b, again[w]) for b, w in scan.rebound)
            outs = self.body(op, 0, list(bound), b_out, list(bound.values()))
            return tuple(outs[:nk]), tuple(outs[nk:])

        return one

    def _backward_scan(self, env: dict, op, args, scan):
        """The backward scan under remat `scan` (backward_layer)."""
        fwd = self.program.ops[scan.forward]
        nc, nk = op.params["num_consts"], op.params["num_carry"]
        xs = [args[p] for p in self.backward_xs(op, scan)]
        emitted = env[("stacks", fwd.id)]
        fwd_consts = [env[fwd.operands[i]] for i, _ in scan.consts]
        fwd_stacks = [env[fwd.operands[i]] for i, _ in scan.stacks]
        one = self.backward_layer(op, scan, args[:nc], fwd_consts)
        carry, ys = self._scan(op, one, args[nc:nc + nk], [*xs, *emitted, *fwd_stacks])
        return [*carry, *ys]

    def _scan(self, op, one, init, xs):
        return jax.lax.scan(one, tuple(init), tuple(xs), length=op.params["length"],
                            reverse=op.params["reverse"], unroll=op.params.get("unroll", 1))


# The named scope under which `rewritten_step` replays op <id>: "toast_lab_op<id>".
OP_SCOPE = "toast_lab_op"


class _Tagged(StepReplay):
    """The rewrite alone: no sharding constraints, each op replayed under its OP_SCOPE, so
    that the rewritten program's ops say which op of the step as written each one runs, and
    then under the innermost scope of its own (an einsum's spec, "tril"), which the cost
    model reads to know the kernels XLA runs (cost/_fusion.py: fused attention)."""

    def _constrained(self, x, spec):
        return x

    def step(self, env: dict, op) -> None:
        own = op.name_scope.rsplit("/", 1)[-1]
        with jax.named_scope(f"{OP_SCOPE}{op.id}"):
            if not own:
                return super().step(env, op)
            with jax.named_scope(own):
                super().step(env, op)


def rewritten_step(plan):
    """The plan's step as `plan.step` rewrites it (module docstring), without sharding
    constraints, as a function of the traced function's arguments: what the cost model traces
    to price remat and micro-batches. Each op runs under the named scope
    "toast_lab_op<op id>/<its innermost scope as written>" (the innermost tag wins for ops
    nested in a region or a recomputation); ops the rewrite adds (cuts, accumulators,
    barriers) have none of their own."""
    program = plan.analysis.program
    runner = _Tagged(plan, program, None, lambda vid, x: x, frozenset(),
                     lambda op_id, t, x: x, frozenset(), plan.partition_spec)
    return as_function(program, runner=runner)


def _entries(spec, ndim: int) -> list:
    """A PartitionSpec's entries, one per dim of an `ndim`-dim value."""
    entries = list(spec)
    return entries + [None] * (ndim - len(entries))
