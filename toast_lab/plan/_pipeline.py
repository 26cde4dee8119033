"""Pipeline stages as a rewrite of the traced, already differentiated step: a scanned layer
stack cut into stages over one mesh axis, micro-batches flowing through them, as one SPMD
program (the shape MaxText's pipeline gives a `jit`-ed step).

The stack's forward scan F and its transposed scan G (analysis/_layer_groups.py) each become
a loop over T = V M + S - 1 ticks (M micro-batches, S stages, V runs of layers per stage).
The layers' stacked operands [L, ...] are viewed as [S, V, L/(S V), ...] with the stage dim
sharded over the stage axis, so each stage's devices hold their layers (and their gradients
and optimizer state) and nothing else of the stack. Each tick, every stage runs one run of
its layers (a `lax.scan` over them, the stages `vmap`ped with `spmd_axis_name` = the stage
axis) on the micro-batch it holds, then hands its result to the next stage: a `ppermute`
over the stage axis (one collective-permute).

- GPipe (V = 1): all forwards, then all backwards. In the forward loop stage s runs
  micro-batch m = t - s at tick t; stage 0 takes micro-batch t from the stack's input. In
  the backward loop the last stage starts, with the micro-batches in reverse, and the
  cotangent flows down the stages.
- Circular (V >= 2, MaxText's circular pipeline): stage s holds the stack's runs s, S + s,
  2 S + s, ...; a micro-batch goes round the stages V times, the hand-off from the last stage
  to the first closing the ring, and waits on the first stage between rounds (a loop-back
  buffer) until its turn comes again, which needs M >= S. The bubble is
  (S - 1) / (V M + S - 1) of each loop instead of (S - 1) / (M + S - 1).
- Residuals: F's per-layer stacks (what G reads; under remat, what stays and what the
  recomputation reads) are kept per stage and work item (micro-batch and run), in buffers
  [S, V M, n, ...] indexed by (w + s) mod V M. That index is t mod V M in the forward loop
  and (V M + S - 2 - u) mod V M in the backward one, the same for every stage at a tick: a
  plain dynamic slice, no per-stage gather.
- Ticks where a stage holds no micro-batch (the bubble) still run its layers, on stale data,
  and their results are masked out: the bubble costs the same compute time on the devices as
  in any SPMD pipeline.
- Per-example constants the stack reads (an attention mask) are cut into micro-batches and
  each stage takes its micro-batch's slice; batch-independent ones (RoPE tables) are shared.
- G's accumulators that are not per example (gradients of the stack's shared constants)
  start at zero on each stage and are summed over the stages after the loop; its per-layer
  results (the weight gradients) are summed over the micro-batches each stage ran.
- Remat (plan/_remat.py) composes: each run's backward recomputes its layers' residuals from
  what stays, inside the backward loop.

What runs outside the stack (embedding, head, loss, optimizer) runs once, on the whole batch,
with the plan's sharding, as written. Refused, naming the reason: a stack the micro-batch
analysis cannot split, a stack whose carry holds something other than per-example values,
whose per-layer operands hold examples, or whose residuals someone other than its backward
scan reads; a layer count the stages (and runs) do not divide.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh, PartitionSpec

from ..analysis import SCANNED
from ..program import CONST


GPIPE, CIRCULAR = "gpipe", "circular"
SCHEDULES = (GPIPE, CIRCULAR)


@dataclass(frozen=True)
class Pipeline:
    """A pipelined stack: layer group `group` cut into `stages` stages over mesh axis
    `axis` (module docstring). schedule GPIPE: each stage holds one run of L/S layers;
    CIRCULAR: `chunks` runs of L/(S chunks) layers each, stage s the runs s, s + S, ...,
    each micro-batch going round the stages `chunks` times (a bubble `chunks` times
    smaller)."""

    group: str
    axis: str
    stages: int
    schedule: str = GPIPE
    chunks: int = 1

    def __str__(self) -> str:
        """The value text: "<axis>:<stages>", with "x<chunks>" for a circular schedule
        ("stage:4x2")."""
        return f"{self.axis}:{self.stages}" + (f"x{self.chunks}" if self.chunks > 1 else "")

    def bubble(self, micro_batches: int) -> float:
        """The share of each loop a stage spends idle: (S - 1) / (chunks M + S - 1)."""
        s = self.stages
        return (s - 1) / (self.chunks * micro_batches + s - 1)
# The most micro-batches per stage the expert recipes and the search offer: enough to bring
# the bubble, (S - 1) / (M + S - 1), under a fifth of the step.
MICRO_BATCHES_PER_STAGE = 4


# The named scope of each loop's stage index (an iota over the stages): its dim is the stage
# dim of every per-stage value, which the cost model shards over the stage axis.
STAGE_SCOPE = "toast_lab_stage"


class PipelineRefused(ValueError):
    """The stack cannot be pipelined as asked: says why."""


@dataclass(frozen=True)
class StackPipeline:
    """Where each operand and result of a stack's two scans goes in the pipelined loops.

    forward / backward: the op ids of F and G. f_batch_consts / f_shared_consts: positions
    of F's consts that hold examples / do not. Same for G (g_*). g_carry_batch /
    g_carry_acc: positions (within G's carries) that flow down the stages / accumulate.
    g_xs_residual: {position of a G xs operand: index of the F ys it reads}; g_xs_layers:
    positions of G's xs read straight from the layers' stacks. layer_class: the class of
    the stacks' layer dim, which the stage axis shards.
    """

    pipeline: Pipeline
    forward: int
    backward: int
    layers: int
    layer_class: int
    f_batch_consts: tuple[int, ...]
    f_shared_consts: tuple[int, ...]
    g_batch_consts: tuple[int, ...]
    g_shared_consts: tuple[int, ...]
    g_carry_batch: tuple[int, ...]
    g_carry_acc: tuple[int, ...]
    g_xs_residual: dict
    g_xs_layers: tuple[int, ...]

    @property
    def per_stage(self) -> int:
        """Layers per run (a stage holds `chunks` runs)."""
        return self.layers // (self.pipeline.stages * self.pipeline.chunks)


def stack_pipeline(analysis, pipeline: Pipeline) -> StackPipeline:
    """The StackPipeline of `pipeline` on `analysis`'s step, or PipelineRefused. Kept with the
    analysis (the plan, the search's space, the rewrite and the cost model all ask for it),
    refusals too."""
    def build():
        try:
            return _stack_pipeline(analysis, pipeline)
        except PipelineRefused as err:
            return err
    found = analysis.derived(("plan.stack_pipeline", pipeline), build)
    if isinstance(found, PipelineRefused):
        raise PipelineRefused(str(found))
    return found


def _stack_pipeline(analysis, pipeline: Pipeline) -> StackPipeline:
    groups = {g.name: g for g in analysis.layer_groups}
    group = groups.get(pipeline.group)
    if group is None or group.kind != SCANNED:
        scanned = [g.name for g in analysis.layer_groups if g.kind == SCANNED]
        raise PipelineRefused(
            f"pipeline@{pipeline.group}: stages cut a scanned layer stack (a lax.scan over "
            f"stacked layers); scanned stacks of {analysis.program.fn_name!r}: "
            f"{scanned or 'none'}")
    if pipeline.schedule not in SCHEDULES:
        raise PipelineRefused(f"pipeline@{group.name}: schedule {pipeline.schedule!r} is not "
                              f"one of {list(SCHEDULES)}")
    if (pipeline.schedule == GPIPE) != (pipeline.chunks == 1) or pipeline.chunks < 1:
        raise PipelineRefused(f"pipeline@{group.name}: a {pipeline.schedule} schedule with "
                              f"{pipeline.chunks} chunks per stage; GPipe has 1, a circular "
                              f"schedule 2 or more")
    if pipeline.stages < 2 or group.layers % (pipeline.stages * pipeline.chunks):
        runs = f" in {pipeline.chunks} chunks each" if pipeline.chunks > 1 else ""
        raise PipelineRefused(f"pipeline@{group.name}: {pipeline.stages} stages{runs} do not "
                              f"divide its {group.layers} layers evenly")
    mb = analysis.micro_batching
    if not mb.legal:
        raise PipelineRefused(f"pipeline@{group.name}: a pipeline runs micro-batches through "
                              f"the stages, and the batch cannot be split: {mb.reason}")
    prog = analysis.program
    fwd, bwd = prog.ops[group.units[0][0]], group.backward_scans[0]
    if len(group.units) != 1 or bwd < 0:
        raise PipelineRefused(f"pipeline@{group.name}: the stack has no backward scan to "
                              f"pipeline ({group.source}); stages pipeline a training step")
    bwd = prog.ops[bwd]
    where = f"pipeline@{group.name} ({group.source})"
    holds = _batch_test(prog, mb)
    f_nc, f_nk = fwd.params["num_consts"], fwd.params["num_carry"]
    g_nc, g_nk = bwd.params["num_consts"], bwd.params["num_carry"]
    if fwd.params["reverse"] or not bwd.params["reverse"]:
        raise PipelineRefused(f"{where}: the forward scan runs its layers backwards")
    if not all(holds(v) for v in fwd.operands[f_nc:f_nc + f_nk]):
        raise PipelineRefused(f"{where}: the stack carries a value that is not per example "
                              f"from layer to layer, which stages cannot hand on")
    if any(holds(v) for v in fwd.operands[f_nc + f_nk:]):
        raise PipelineRefused(f"{where}: a per-layer operand of the stack holds examples")
    body_consts = {v for o in prog.ops[slice(*fwd.body_ops)] for v in o.operands
                   if prog.values[v].origin == CONST and holds(v)}
    if body_consts:
        raise PipelineRefused(f"{where}: the layer reads a constant that holds examples")
    ys = {r: j for j, r in enumerate(fwd.results[f_nk:])}
    for r in ys:
        if any(u != bwd.id for u in prog.users(r)) or r in prog.outputs:
            raise PipelineRefused(f"{where}: a per-layer result of the stack is read by "
                                  f"something other than its backward pass")
    residual, layers_xs = {}, []
    for p in range(g_nc + g_nk, len(bwd.operands)):
        v = bwd.operands[p]
        if v in ys:
            residual[p] = ys[v]
        elif holds(v):
            raise PipelineRefused(f"{where}: the backward scan reads per-layer examples "
                                  f"that its forward scan did not make")
        else:
            layers_xs.append(p)
    if any(holds(r) for r in bwd.results[g_nk:]):
        raise PipelineRefused(f"{where}: the backward scan returns per-layer examples")
    g_carries = list(range(g_nk))
    acc = tuple(k for k in g_carries if not holds(bwd.operands[g_nc + k]))
    if any(not jnp.issubdtype(prog.values[bwd.operands[g_nc + k]].dtype, jnp.inexact)
           for k in acc):
        raise PipelineRefused(f"{where}: the backward scan carries a value that is neither "
                              f"per example nor a gradient sum")
    def split(op, n):  # its first n operands: (those that hold examples, the others)
        held = [holds(v) for v in op.operands[:n]]
        return (tuple(p for p in range(n) if held[p]), tuple(p for p in range(n) if not held[p]))

    f_b, f_s = split(fwd, f_nc)
    g_b, g_s = split(bwd, g_nc)
    stacks = fwd.operands[f_nc + f_nk:]
    if not stacks:
        raise PipelineRefused(f"{where}: the stack has no per-layer operands (weights) to "
                              f"divide between the stages")
    layer_class = analysis.value_classes[stacks[0]][0]
    return StackPipeline(pipeline, fwd.id, bwd.id, group.layers, layer_class,
                         f_b, f_s, g_b, g_s,
                         tuple(k for k in g_carries if k not in acc), acc, residual,
                         tuple(layers_xs))


def _batch_test(prog, mb):
    """holds(value): the value carries the batch (one dim, which the pipeline cuts)."""
    def holds(v: int) -> bool:
        dims = mb.batch_dims.get(v, ())
        if len(dims) > 1:
            raise PipelineRefused(f"a value of the stack holds the batch merged with another "
                                  f"dim ({list(prog.values[v].shape)})")
        return bool(dims)
    return holds


# --- the replay of the two scans as pipelined loops (StepReplay calls these) ----------------

class PipelinedScans:
    """StepReplay's pipelined F and G (module docstring). Needs the replay's `program`,
    `mesh` / `spec` / `_constrained` / `_cut` / `_uncut` / `body` / `operands` / `write`,
    its layer functions (`forward_layer`, `backward_layer`), its micro-batch resizing
    (`micro`, `count`, `split`), its `remat` and `pipe` (a StackPipeline).

    Work items: each stage runs W = chunks x M items, item w being micro-batch w mod M on
    the stage's run w // M of layers; at tick t stage s runs item t - s (forward) or item
    W - 1 - (t - (S - 1 - s)) (backward, in reverse). A micro-batch going round again enters
    stage 0 (the last stage, backward) from a loop-back buffer on that stage, filled by the
    cyclic hand-off S ticks after it left; it waits there M - S ticks, so a circular
    schedule needs M >= S."""

    def _pipelined(self, env: dict, op) -> None:
        sp = self.pipe
        self.before(env, op)
        if op.id == sp.forward:
            outs = self._pipeline_forward(env, op, self.operands(env, op))
        else:  # (the residual stacks it reads were never made: the buffers hold them)
            outs = self._pipeline_backward(env, op, [env.get(v) for v in op.operands])
        for vid, x in zip(op.results, outs):
            if x is not None:
                self.write(env, vid, x)

    # --- layout helpers -----------------------------------------------------------------

    def _stage_entries(self, value: int, drop: int) -> list:
        """The plan's spec entries of `value` after its first `drop` dims, without the
        stage axis (which the stage dim holds)."""
        axis = self.pipe.pipeline.axis
        entries = list(self.spec(value)) + [None] * self.program.values[value].ndim
        out = []
        for e in entries[drop:self.program.values[value].ndim]:
            names = e if isinstance(e, tuple) else (e,) if e is not None else ()
            kept = tuple(a for a in names if a != axis)
            out.append(None if not kept else kept[0] if len(kept) == 1 else kept)
        return out

    def _on_stages(self, x, value: int, drop: int, between: int = 0):
        """x laid out [S, <between unsharded dims>, <value's dims after `drop`>], its stage
        dim over the stage axis."""
        spec = PartitionSpec(self.pipe.pipeline.axis, *[None] * between,
                             *self._stage_entries(value, drop))
        return self._constrained(x, spec)

    def _layers(self, value: int, x):
        """A layer stack [L, ...] as [S, chunks, L/(S chunks), ...]: layer (v S + s) n + i
        is layer i of stage s's run v. With one run per stage that is each stage's block of
        the stack as the plan shards it; with several, the runs interleave, and XLA moves
        the stack (and its gradient, back) between the two layouts every step."""
        p = self.pipe.pipeline
        n = x.shape[0] // (p.stages * p.chunks)
        if p.chunks == 1:
            x = x.reshape((p.stages, 1, n) + x.shape[1:])
        else:
            x = x.reshape((p.chunks, p.stages, n) + x.shape[1:]).swapaxes(0, 1)
        return self._on_stages(x, value, 1, 2)

    def _unlayered(self, x, shape):
        """[S, chunks, n, ...] back to the stack's [L, ...]."""
        return (x if self.pipe.pipeline.chunks == 1 else x.swapaxes(0, 1)).reshape(shape)

    def _hand_on(self, x, shift: int):
        """x [S, ...] with each stage's slice handed `shift` stages on, cyclically: a
        `ppermute` over the stage axis in a shard_map manual over that axis alone, which is
        one collective-permute, whatever else shards x. (The rewrite the cost model traces has
        no devices: an abstract mesh of the stage axis names the same collective.)"""
        s, axis = self.pipe.pipeline.stages, self.pipe.pipeline.axis
        mesh = self.mesh if self.mesh is not None else AbstractMesh((s,), (axis,))
        perm = [(i, (i + shift) % s) for i in range(s)]
        hand = jax.shard_map(lambda block: jax.lax.ppermute(block, axis, perm), mesh=mesh,
                             in_specs=PartitionSpec(axis), out_specs=PartitionSpec(axis),
                             axis_names={axis}, check_vma=False)
        return hand(x)

    def _staged(self, fn):
        return jax.vmap(fn, spmd_axis_name=self.pipe.pipeline.axis)

    def _run_layers(self, one, carry, xs, reverse: bool):
        """One run of layers: the layer function `one` (StepReplay.forward_layer or
        backward_layer) scanned over the run's slices of the stacks, at micro-batch shapes."""
        self.micro = True
        try:
            return jax.lax.scan(one, tuple(carry), tuple(xs), length=self.pipe.per_stage,
                                reverse=reverse)
        finally:
            self.micro = False

    def _per_example(self, op, args, positions):
        """The operands of `op` at `positions`, cut into micro-batches: [M, ...]."""
        out = []
        for p in positions:
            v = op.operands[p]
            out.append(self._cut(v, self.split.batch_dims[v][0], args[p]))
        return out

    def _collected(self, cut, value: int):
        """Zeros [S, M, <one micro-batch>], each stage's slice its own: what leaves the
        pipeline (written by the stage that makes it, read once after the loop) and the
        loop-back buffers (the stage that takes micro-batches in)."""
        s = self.pipe.pipeline.stages
        zeros = jnp.zeros((s,) + cut.shape, cut.dtype)
        return self._on_stages(zeros, value, 0, 1)

    def _mb_shape(self, value: int) -> tuple:
        return self.split.shape(value, self.program.values[value].shape, self.count)

    def _entering(self, received, fresh, back, first: int, new, index, ids):
        """Each stage's input at a tick: stage `first` takes micro-batch `index` of `fresh`
        where `new` (its first run), else from its loop-back buffer `back`; the others what
        the stage before handed on (`received`)."""
        idx = self._stage_index
        out = []
        for x, x0, lb, v in zip(received, fresh, back, ids):
            at = index % self.count
            incoming = jnp.where(new, jax.lax.dynamic_index_in_dim(x0, at, 0, keepdims=True),
                                 jax.lax.dynamic_index_in_dim(lb, at, 1, keepdims=False))
            out.append(self._on_stages(jnp.where(_per_stage(idx == first, x), incoming, x),
                                       v, 0))
        return out

    def _chunk(self, stacks, run):
        """Each stage's run `run` [S] of the stacks [S, chunks, n, ...]: [S, n, ...]."""
        if self.pipe.pipeline.chunks == 1:
            return [x[:, 0] for x in stacks]
        pick = jax.vmap(lambda x, r: jax.lax.dynamic_index_in_dim(x, r, 0, keepdims=False))
        return [pick(x, run) for x in stacks]

    def _ticks(self) -> int:
        return self.pipe.pipeline.chunks * self.count + self.pipe.pipeline.stages - 1

    # --- F: the forward loop --------------------------------------------------------------

    def _pipeline_forward(self, env: dict, op, args) -> list:
        sp, prog, m_count = self.pipe, self.program, self.count
        s_count, runs = sp.pipeline.stages, sp.pipeline.chunks
        items = runs * m_count
        nc, nk, n_in = op.params["num_consts"], op.params["num_carry"], len(op.operands)
        remat = self.remat.scans.get(op.id)
        f_out = op.body[n_in:]
        first = self._per_example(op, args, range(nc, nc + nk))
        cut_consts = self._per_example(op, args, sp.f_batch_consts)
        shared = {p: args[p] for p in sp.f_shared_consts}
        layers = [self._layers(op.operands[p], args[p]) for p in range(nc + nk, n_in)]
        with jax.named_scope(STAGE_SCOPE):
            idx = self._stage_index = jnp.arange(s_count)
        carry_ids = op.operands[nc:nc + nk]
        # the buffers: the kept per-layer results, then what remat emits for its recompute
        kept = [j for j in self.kept_results(op, remat) if j >= nk]
        ys_ids = [f_out[j] for j in kept] + list(remat.emitted if remat else ())

        def stage(carry, consts_b, xs):
            consts = dict(shared)
            consts.update(zip(sp.f_batch_consts, consts_b))
            one = self.forward_layer(op, remat, [consts[p] for p in range(nc)])
            return self._run_layers(one, carry, xs, False)

        staged = self._staged(stage)

        def tick(state, t):
            h, back, bufs, outs = state
            w = t - idx                      # each stage's item
            valid = (w >= 0) & (w < items)
            run = jnp.clip(w, 0, items - 1) // m_count
            m = jnp.clip(w, 0, items - 1) % m_count
            h_in = self._entering(h, first, back, 0, t < m_count, t, carry_ids)
            h_out, ys = staged(h_in, [jnp.take(c, m, axis=0) for c in cut_consts],
                               self._chunk(layers, run))
            handed = [self._hand_on(x, 1) for x in h_out]
            bufs = [_put(buf, y, valid, t % items, 1) for buf, y in zip(bufs, ys)]
            last = idx == s_count - 1
            done = jnp.clip(t - (s_count - 1), 0, items - 1) % m_count  # the last stage's
            outs = [_put(o, x, last & valid & (run == runs - 1), done, 1)
                    for o, x in zip(outs, h_out)]
            # stage 0 keeps what comes round from the last stage (its item t - S + 1) for
            # that micro-batch's next run
            came = t - s_count + 1
            back = [_put(b, x, (idx == 0) & (came >= 0) & (came < items - m_count),
                         came % m_count, 1) for b, x in zip(back, handed)] if runs > 1 else back
            return (handed, back, bufs, outs), None

        h0 = [self._on_stages(jnp.broadcast_to(x[:1], (s_count,) + x.shape[1:]), v, 0)
              for x, v in zip(first, carry_ids)]
        bufs0 = [self._on_stages(jnp.zeros((s_count, items, sp.per_stage)
                                           + self._mb_shape(y), prog.values[y].dtype), y, 0, 2)
                 for y in ys_ids]
        outs0 = [self._collected(x, v) for x, v in zip(first, carry_ids)]
        back0 = [self._collected(x, v) for x, v in zip(first, carry_ids)] if runs > 1 \
            else outs0
        (_, _, bufs, outs), _ = jax.lax.scan(tick, (h0, back0, bufs0, outs0),
                                             jnp.arange(self._ticks(), dtype=np.int32))
        env[("pipeline", op.id)] = (dict(zip(kept, bufs)), bufs[len(kept):], cut_consts)
        return [self._uncut(r, _from_stage(o)) for r, o in zip(op.results[:nk], outs)] + \
            [None] * (len(op.results) - nk)

    # --- G: the backward loop -------------------------------------------------------------

    def _pipeline_backward(self, env: dict, op, args) -> list:
        sp, prog, m_count = self.pipe, self.program, self.count
        s_count, runs = sp.pipeline.stages, sp.pipeline.chunks
        items = runs * m_count
        nc, nk = op.params["num_consts"], op.params["num_carry"]
        remat = self.remat.scans.get(op.id)
        fwd = prog.ops[sp.forward]
        f_nk = fwd.params["num_carry"]
        kept, emitted, fwd_cut = env[("pipeline", sp.forward)]
        first = self._per_example(op, args, [nc + k for k in sp.g_carry_batch])
        cut_consts = self._per_example(op, args, sp.g_batch_consts)
        shared = {p: args[p] for p in sp.g_shared_consts}
        xs_at = self.backward_xs(op, remat)
        layers = {p: self._layers(op.operands[p], args[p]) for p in xs_at
                  if p in sp.g_xs_layers}
        residual_at = [p for p in xs_at if p in sp.g_xs_residual]
        # under remat: the forward scan's stacks and consts its recomputation reads
        fwd_stacks = [self._layers(fwd.operands[i], env[fwd.operands[i]])
                      for i, _ in (remat.stacks if remat else ())]
        fwd_consts_at = [i for i, _ in (remat.consts if remat else ())]
        fwd_shared = {i: env[fwd.operands[i]] for i in fwd_consts_at
                      if i in sp.f_shared_consts}
        with jax.named_scope(STAGE_SCOPE):
            idx = self._stage_index = jnp.arange(s_count)
        carry_ids = [op.operands[nc + k] for k in sp.g_carry_batch]
        acc_ids = [op.operands[nc + k] for k in sp.g_carry_acc]

        def stage(carry_b, acc, consts_b, fwd_b, xs_layers, xs_res, xs_emitted, xs_fwd):
            consts = dict(shared)
            consts.update(zip(sp.g_batch_consts, consts_b))
            fwd_consts = dict(fwd_shared)
            fwd_consts.update(zip(sp.f_batch_consts, fwd_b))
            carry = dict(zip(sp.g_carry_batch, carry_b))
            carry.update(zip(sp.g_carry_acc, acc))
            xs = dict(zip(layers, xs_layers))
            xs.update(zip(residual_at, xs_res))
            one = self.backward_layer(op, remat, [consts[p] for p in range(nc)],
                                      [fwd_consts[i] for i in fwd_consts_at])
            out, ys = self._run_layers(one, [carry[k] for k in range(nk)],
                                       [xs[p] for p in xs_at] + list(xs_emitted)
                                       + list(xs_fwd), True)
            return ([out[k] for k in sp.g_carry_batch], [out[k] for k in sp.g_carry_acc],
                    list(ys))

        staged = self._staged(stage)

        def tick(state, u):
            h, back, acc, grads, outs = state
            w = items - 1 - (u - (s_count - 1 - idx))  # each stage's item, in reverse
            valid = (w >= 0) & (w < items)
            run = jnp.clip(w, 0, items - 1) // m_count
            m = jnp.clip(w, 0, items - 1) % m_count
            top = items - 1 - u                      # the last stage's item
            h_in = self._entering(h, first, back, s_count - 1, u < m_count, top, carry_ids)
            take = [jnp.take(c, m, axis=0) for c in cut_consts]
            fwd_b = [jnp.take(c, m, axis=0) for c in fwd_cut] if fwd_consts_at else []
            pos = (items + s_count - 2 - u) % items
            def here(buf):  # this tick's residuals of each stage's item
                return jax.lax.dynamic_index_in_dim(buf, pos, 1, keepdims=False)

            res = [here(kept[f_nk + sp.g_xs_residual[p]]) for p in residual_at]
            h_out, a_out, ys = staged(h_in, acc, take, fwd_b,
                                      self._chunk(list(layers.values()), run), res,
                                      [here(b) for b in emitted], self._chunk(fwd_stacks, run))
            acc = [jnp.where(_per_stage(valid, a), n, a) for a, n in zip(acc, a_out)]
            into = (jnp.arange(runs)[None, :] == run[:, None]) & valid[:, None]  # [S, chunks]
            grads = [g + jnp.where(into.reshape(into.shape + (1,) * (y.ndim - 1)),
                                   y[:, None], 0).astype(g.dtype) for g, y in zip(grads, ys)]
            done = jnp.clip(items - 1 - (u - (s_count - 1)), 0, items - 1) % m_count
            outs = [_put(o, x, (idx == 0) & valid & (run == 0), done, 1)
                    for o, x in zip(outs, h_out)]
            handed = [self._hand_on(x, -1) for x in h_out]
            # the last stage keeps what comes round from stage 0 (its item this tick) for
            # that micro-batch's next run, which is an earlier one
            came = items - 1 - (u - (s_count - 1))
            back = [_put(b, x, (idx == s_count - 1) & (came >= m_count) & (came < items),
                         came % m_count, 1) for b, x in zip(back, handed)] if runs > 1 else back
            return (handed, back, acc, grads, outs), None

        h0 = [self._on_stages(jnp.broadcast_to(x[-1:], (s_count,) + x.shape[1:]), v, 0)
              for x, v in zip(first, carry_ids)]
        acc0 = [self._on_stages(jnp.zeros((s_count,) + prog.values[v].shape,
                                          prog.values[v].dtype), v, 0) for v in acc_ids]
        grads0 = [self._on_stages(jnp.zeros((s_count, runs, sp.per_stage)
                                            + prog.values[r].shape[1:],
                                            _sum_dtype(prog.values[r].dtype)), r, 1, 2)
                  for r in op.results[nk:]]
        outs0 = [self._collected(x, v) for x, v in zip(first, carry_ids)]
        back0 = [self._collected(x, v) for x, v in zip(first, carry_ids)] if runs > 1 \
            else outs0
        (_, _, acc, grads, outs), _ = jax.lax.scan(
            tick, (h0, back0, acc0, grads0, outs0), jnp.arange(self._ticks(), dtype=np.int32))
        carry_out = dict(zip(sp.g_carry_batch,
                             [self._uncut(op.results[k], _from_stage(o))
                              for k, o in zip(sp.g_carry_batch, outs)]))
        carry_out.update((k, args[nc + k] + a.sum(axis=0).astype(args[nc + k].dtype))
                         for k, a in zip(sp.g_carry_acc, acc))
        ys = [self._unlayered(g, prog.values[r].shape).astype(prog.values[r].dtype)
              for g, r in zip(grads, op.results[nk:])]
        return [carry_out[k] for k in range(nk)] + ys


def _per_stage(mask, x):
    """A per-stage [S] mask broadcast against x [S, ...]."""
    return mask.reshape(mask.shape + (1,) * (x.ndim - 1))


def _from_stage(buf):
    """What one stage wrote into `buf` [S, ...] (the others' slices stay zeros), on every
    stage. A sum over the stage dim: XLA runs it as an all-reduce of one slice, where a slice
    of the stage-sharded dim would gather all S slices onto every device (S times the bytes,
    and S times the memory). Adding zeros leaves every value as the stage wrote it, so the
    sum runs in the buffer's own dtype (jnp.sum would widen bfloat16 to float32 first)."""
    return jax.lax.reduce(buf, np.zeros((), buf.dtype), jax.lax.add, (0,))


def _put(buf, x, keep, pos, axis: int):
    """buf with x written at index pos of `axis` where `keep` (per stage, or one flag), its
    old slice kept elsewhere: one dynamic slice and update, whatever the mask."""
    old = jax.lax.dynamic_index_in_dim(buf, pos, axis, keepdims=False)
    mask = _per_stage(keep, x) if jnp.ndim(keep) else keep
    new = jnp.where(mask, x.astype(buf.dtype), old)
    return jax.lax.dynamic_update_index_in_dim(buf, new, pos, axis)


def _sum_dtype(dtype):
    dtype = np.dtype(dtype)
    return np.float32 if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4 else dtype
