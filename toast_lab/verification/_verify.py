"""Verify a plan: compile it on simulated devices, run it, compare with the unsharded function,
and read what XLA did (DESIGN.md §9).

Numerics. Each output leaf is compared with the unsharded result by its relative error in the
2-norm,

    error = ||out - ref||_2 / (||ref||_2 + tiny)         (tiny: the dtype's smallest normal)

against a tolerance of its dtype (TOLERANCES): float64 1e-6, float32 1e-2, float16 and
bfloat16 5e-2, 8- and 4-bit floats 2e-1. Integer and boolean leaves must be equal (tolerance
0; their error is the fraction of elements that differ). Non-finite entries must sit at the
same places with the same values (NaN where NaN, +inf where +inf); the norms are taken over the
rest, and a different pattern is an error of inf. A leaf whose reference is all zeros has no
scale of its own: it is compared at NOISE_FLOOR of the step's scale instead.

Ill-conditioned leaves. `verify` runs the reference twice, the second time with its floating
inputs moved by a few ulps (`_sensitivity.py`), and allows each leaf
max(tolerance, SPREAD_FACTOR x the relative difference of the two reference runs). That
difference is tiny for almost every leaf, and O(1) for the leaves that are rounding noise (a
parameter whose exact gradient is zero, once Adam has normalised it); those are reported as
ill-conditioned, with what they were checked at. `_sensitivity.py` says why 8 ulps and why 8.

Why a 2-norm, and why these numbers: a sharded step sums in another order, and a training step
amplifies those last-bit differences in a few elements. Adam divides the gradient by
sqrt(nu) + eps, so a parameter whose gradient entry is near eps moves by anywhere up to ±lr:
one such entry (gradient 1.2e-9) of the tiny MoE's attention output weight differs by 8.5e-5
between two *unsharded* builds (XLA backend optimization levels 0 and 2), a relative 2-norm
error of 1.3e-4 for that parameter, and up to 3e-3 if the entry's sign flipped. The largest
elementwise error, normalized by the leaf's largest entry, is worse still (2e-3 on a correct
plan of the tiny GPT). Correct plans of the zoo stay below 3e-4 in float32; the tolerances keep
a margin above that. Real sharding bugs (a missing or doubled all-reduce, a wrong shard) are
wrong everywhere and show as errors of 0.3 to 15 in the optimizer state and the loss.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import jax
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ..program import check_args
from ._compiled import CompiledStats, read_compiled
from ._sensitivity import (PERTURBATION_ULPS, RESAMPLES, SPREAD_FACTOR, is_noise,
                           perturb_inputs, spread_allowance)

# Relative 2-norm error allowed per floating dtype (see the module docstring).
TOLERANCES: Mapping[str, float] = {
    "float64": 1e-6,
    "float32": 1e-2,
    "float16": 5e-2,
    "bfloat16": 5e-2,
}
_LOW_PRECISION_TOLERANCE = 2e-1  # float8 / float4 kinds

# A leaf whose reference is all zeros (over its finite entries) has no scale of its own: it is
# compared at NOISE_FLOOR x the largest RMS over the step's floating outputs x sqrt(size), so
# that rounding noise where the reference happened to get exact zeros is not an infinite error.
# Only there: as a floor for every leaf (what it was before the sensitivity run) it hid every
# small leaf: Adam's second moments (1e-9..1e-7) next to a loss of ~5 read a 100% error as
# 0.1..3%, under float32's tolerance.
NOISE_FLOOR = 1e-4

# Standard deviation of the floats that `concrete_args` draws (like a small weight init).
ARG_SCALE = 0.02

# verify compiles without XLA's CPU backend (LLVM) optimizations: the HLO it reads, the buffer
# assignment behind memory_analysis() and the collectives are the same (checked on jax 0.10.2),
# and compiling is 2-3x faster. Pass compiler_options={} for a fully optimized build.
FAST_COMPILE = {"xla_backend_optimization_level": 0}

def tolerance_of(dtype) -> float:
    """The relative 2-norm error allowed for a leaf of `dtype` (0 for integers and bools)."""
    dtype = np.dtype(dtype)
    if not _is_inexact(dtype):
        return 0.0
    if dtype.kind == "c":
        dtype = np.dtype(dtype.type(0).real.dtype)
    return TOLERANCES.get(dtype.name, _LOW_PRECISION_TOLERANCE)


def concrete_args(args, seed: int = 0):
    """Concrete arrays for `jax.ShapeDtypeStruct` leaves of `args` (other leaves stay as they are).

    Floats are drawn from N(0, ARG_SCALE²) with a numpy Generator seeded by `seed`; integers and
    booleans are zeros, since their valid range (token ids, indices, counts) is unknown here and
    zero is valid for all of them. Zoo models: pass `toast_lab.zoo.sample(name)` instead, which
    draws valid tokens and a fresh optimizer state (random floats make Adam's second moments
    negative, so the updated parameters are NaN, and only the finite entries get compared).
    """
    rng = np.random.default_rng(seed)

    def make(x):
        if not isinstance(x, jax.ShapeDtypeStruct):
            return x
        if _is_key(x):  # new-style PRNG keys: random key words of the key's implementation
            impl = x.dtype._impl  # jax/_src/prng.py KeyTy; `jax.random.key_impl` needs a key
            words = rng.integers(0, 2**32, (*x.shape, *impl.key_shape), dtype=np.uint32)
            return jax.random.wrap_key_data(words, impl=str(impl.name))
        dtype = np.dtype(x.dtype)
        if not _is_inexact(dtype):
            return np.zeros(x.shape, dtype)
        if dtype.kind == "c":
            real = rng.normal(0.0, ARG_SCALE, (2, *x.shape))
            return (real[0] + 1j * real[1]).astype(dtype)
        return rng.normal(0.0, ARG_SCALE, x.shape).astype(dtype)

    return jax.tree.map(make, args)


def _is_key(x) -> bool:
    """A new-style PRNG key array or ShapeDtypeStruct (dtype key<impl>)."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _key_data(tree):
    """Keys as their uint32 words (which NumPy can hold and compare); other leaves as they are."""
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _is_inexact(dtype: np.dtype) -> bool:
    return dtype.kind in "fc" or dtype in _ML_FLOATS


_ML_FLOATS = {np.dtype(getattr(ml_dtypes, n)) for n in (
    "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e4m3b11fnuz", "float8_e4m3", "float8_e3m4", "float8_e8m0fnu", "float4_e2m1fn",
) if hasattr(ml_dtypes, n)}


# --- comparing outputs ----------------------------------------------------------------------


@dataclass(frozen=True)
class LeafCheck:
    """One output leaf compared with the unsharded result.

    path: the leaf's pytree path, e.g. "[0]['blocks'][0]['mlp']['w_out']".
    error: relative 2-norm error (floats) or fraction of differing elements (integers, bools);
        inf where the non-finite entries differ.
    tolerance: what the leaf was checked at: base_tolerance, or SPREAD_FACTOR x spread where
        that is larger (an ill-conditioned leaf; inf where its non-finite entries move).
    spread: the same error between the reference and the reference on perturbed inputs (0 when
        no perturbed reference was given).
    base_tolerance: what the leaf's dtype allows (or the caller's tolerance); None: tolerance.
    """

    path: str
    dtype: str
    shape: tuple[int, ...]
    error: float
    tolerance: float
    spread: float = 0.0
    base_tolerance: float | None = None

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance

    @property
    def loosened(self) -> bool:
        """Checked at more than its dtype allows, because the reference itself is that
        sensitive (see `toast_lab.verification._sensitivity`)."""
        return self.base_tolerance is not None and self.tolerance > self.base_tolerance

    @property
    def ratio(self) -> float:
        """error / tolerance: above 1 fails."""
        if self.error == 0:
            return 0.0
        return self.error / self.tolerance if self.tolerance else math.inf


def compare_outputs(out, ref, tolerance: float | None = None,
                    perturbed=None, computed_in: Sequence[float] | None = None,
                    resampled: Sequence = ()) -> tuple[LeafCheck, ...]:
    """Compare two pytrees leaf by leaf (see the module docstring for the rule).

    tolerance: one tolerance for every floating leaf instead of TOLERANCES.
    perturbed: the reference function's outputs on perturbed inputs (`perturb_inputs`), shaped
        like `ref`. Each leaf is then allowed max(tolerance, SPREAD_FACTOR x its spread), the
        spread being the error of `perturbed` against `ref`; None: the tolerances alone.
    computed_in: per leaf, the tolerance of the least precise float its value was computed
        through (`computed_in_tolerances`); a float32 leaf computed in bfloat16 is checked at
        bfloat16's. None: each leaf's own dtype.
    resampled: more runs of the reference on inputs perturbed with other seeds. A leaf that
        `perturbed` shows to be noise takes its largest spread over all of them
        (`_sensitivity.py`, "More draws").
    """
    out_leaves, out_tree = jax.tree_util.tree_flatten_with_path(_key_data(out))
    ref_leaves, ref_tree = jax.tree_util.tree_flatten_with_path(_key_data(ref))
    if out_tree != ref_tree:
        raise ValueError(f"outputs are shaped differently: {out_tree} vs the unsharded {ref_tree}")
    if perturbed is None:
        moved = [None] * len(ref_leaves)
    else:
        moved, moved_tree = jax.tree_util.tree_flatten(_key_data(perturbed))
        if moved_tree != ref_tree:
            raise ValueError(f"the perturbed reference is shaped differently: {moved_tree} vs "
                             f"{ref_tree}")
    others = [jax.tree_util.tree_flatten(_key_data(r))[0] for r in resampled]
    triples = []
    for (path, a), (_, b), c in zip(out_leaves, ref_leaves, moved):
        a, b = np.asarray(a), np.asarray(b)
        name = jax.tree_util.keystr(path)
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(f"output {name}: {a.dtype}{list(a.shape)} vs the unsharded "
                             f"{b.dtype}{list(b.shape)}")
        triples.append((name, a, b, None if c is None else np.asarray(c)))
    scale = _output_scale(b for _, _, b, _ in triples)
    checks = []
    floors = [0.0] * len(triples) if computed_in is None else list(computed_in)
    for i, ((name, a, b, c), floor) in enumerate(zip(triples, floors)):
        base = tolerance_of(b.dtype)
        if tolerance is not None and base:
            base = float(tolerance)
        elif base:
            base = max(base, floor)
        spread = 0.0 if c is None else _leaf_error(c, b, scale)
        if is_noise(base, spread):
            spread = max([spread] + [_leaf_error(np.asarray(o[i]), b, scale) for o in others])
        checks.append(LeafCheck(name, b.dtype.name, b.shape, _leaf_error(a, b, scale),
                                spread_allowance(base, spread), spread, base))
    return tuple(checks)


def computed_in_tolerances(prog) -> list[float]:
    """Per program output, the tolerance of the least precise float on any path to it from the
    inputs (TOLERANCES): the weights of a mixed-precision step are float32, updated from
    gradients computed in bfloat16, and differ between two summation orders as bfloat16 does.
    A region's results pass through everything its body computes."""
    values, ops = prog.values, prog.ops
    tol = np.array([tolerance_of(v.dtype) if _is_float_value(v) else 0.0 for v in values])
    for _ in range(4):  # region bodies are listed after their op: repeat until nothing moves
        before = tol.copy()
        for op in ops:
            reads = [tol[v] for v in op.operands]
            if op.body_ops[1] > op.body_ops[0]:
                reads += [tol[r] for o in ops[op.body_ops[0]:op.body_ops[1]] for r in o.results]
            worst = max(reads, default=0.0)
            for r in op.results:
                if _is_float_value(values[r]):
                    tol[r] = max(tol[r], worst)
        if np.array_equal(before, tol):
            break
    return [float(tol[v]) for v in prog.outputs]


def _is_float_value(value) -> bool:
    try:
        return _is_inexact(np.dtype(value.dtype))
    except TypeError:  # extended dtypes (PRNG keys)
        return False


def _output_scale(refs) -> float:
    """The largest root-mean-square value over the floating output leaves (finite entries)."""
    scale = 0.0
    for b in refs:
        if b.size and _is_inexact(b.dtype):
            x = np.abs(b.astype(np.complex128 if b.dtype.kind == "c" else np.float64))
            x = x[np.isfinite(x)]
            if x.size:
                scale = max(scale, float(np.sqrt(np.mean(np.square(x)))))
    return scale


def _leaf_error(out: np.ndarray, ref: np.ndarray, scale: float = 0.0) -> float:
    if out.size == 0:
        return 0.0
    if not _is_inexact(ref.dtype):
        return float(np.mean(out != ref))
    tiny = float(np.finfo(np.float32 if ref.dtype.itemsize < 4 else ref.dtype).tiny)
    if ref.dtype.kind == "c":
        out, ref = np.stack([out.real, out.imag]), np.stack([ref.real, ref.imag])
    # 2-norms in float64 (bfloat16 and float8 go through float32, which holds them exactly).
    out = out.astype(np.float32 if out.dtype.itemsize < 4 else out.dtype).astype(np.float64)
    ref = ref.astype(np.float32 if ref.dtype.itemsize < 4 else ref.dtype).astype(np.float64)
    finite = np.isfinite(ref)
    if not np.array_equal(np.isfinite(out), finite):
        return math.inf
    if not finite.all():
        a, b = out[~finite], ref[~finite]
        if not np.all((np.isnan(a) & np.isnan(b)) | (a == b)):
            return math.inf
        out, ref = out[finite], ref[finite]
    norm = float(np.linalg.norm(ref))
    if norm == 0.0:  # no scale of its own: see NOISE_FLOOR
        norm = NOISE_FLOOR * scale * math.sqrt(ref.size)
    return float(np.linalg.norm(out - ref) / (norm + tiny))


# --- the report -----------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyReport:
    """What `verify` found for one plan on one mesh.

    numerics_ok: every output leaf within its tolerance of the unsharded function.
    worst_error / worst_leaf / tolerance: the leaf with the largest error relative to its
        tolerance, its error and the tolerance it had (see `toast_lab.verification._verify`).
    checks: every leaf's LeafCheck, in output order; `loosened` lists the ill-conditioned ones.
    stats: XLA's memory (bytes per device), flops and collectives of the compiled step.
    compile_s / run_s: seconds to lower and compile the sharded step / to run it once.
    estimate: whatever the caller passed to compare with (a cost model's estimate), or None.
    """

    numerics_ok: bool
    worst_error: float
    worst_leaf: str
    tolerance: float
    checks: tuple[LeafCheck, ...]
    stats: CompiledStats
    compile_s: float
    run_s: float
    plan: Any
    mesh: Any
    estimate: Any = None

    @property
    def ok(self) -> bool:
        return self.numerics_ok

    @property
    def loosened(self) -> tuple[LeafCheck, ...]:
        """The ill-conditioned leaves: those checked at SPREAD_FACTOR x their spread, above what
        their dtype allows, because the unsharded reference itself moves that much when its
        inputs move by a few ulps (rounding noise, e.g. a parameter whose gradient is zero)."""
        return tuple(c for c in self.checks if c.loosened)

    def comparison(self) -> dict[str, tuple[float, float | None, float | None]]:
        """{row: (measured, estimated or None, estimated / measured or None)} for the memory
        rows (bytes per device), flops, and each collective "kind over axes" (bytes per device
        over the step)."""
        rows: dict[str, tuple[float, float | None, float | None]] = {}
        for label, measured, names in self._scalar_rows():
            est = _estimated(self.estimate, names)
            rows[label] = (measured, est, _ratio(est, measured))
        for key, (count, measured, est) in self._collective_rows().items():
            rows[f"{key[0]} over {_axes_text(key[1])}"] = (measured, est, _ratio(est, measured))
        return rows

    def _scalar_rows(self):
        s = self.stats
        return (
            ("argument", s.argument_bytes, ("argument_bytes",)),
            ("output", s.output_bytes, ("output_bytes",)),
            ("temp", s.temp_bytes, ("temp_bytes",)),
            ("alias", s.alias_bytes, ("alias_bytes",)),
            ("peak", s.peak_bytes, ("peak_memory_bytes", "peak_bytes")),
            ("flops", s.flops, ("flops",)),
        )

    def _collective_rows(self) -> dict[tuple[str, tuple[str, ...]], tuple]:
        """{(kind, axes): (count, measured bytes, estimated bytes or None)}."""
        measured = self.stats.collective_summary()
        estimated = _estimated_collectives(self.estimate)
        rows = {}
        for key in sorted(set(measured) | set(estimated)):
            total = measured.get(key)
            rows[key] = (total.count if total else 0, total.bytes if total else 0,
                         estimated.get(key))
        return rows

    def __str__(self) -> str:
        has_est = self.estimate is not None
        prog = getattr(getattr(self.plan, "analysis", None), "program", None)
        name = getattr(prog, "fn_name", "step")
        verdict = "ok" if self.numerics_ok else "MISMATCH"
        lines = [
            f"verify {name}: {self.plan!r} on {self.mesh!r}",
            f"numerics: {verdict}; worst relative error {self.worst_error:.2g} "
            f"(tolerance {self.tolerance:.2g}) at {self.worst_leaf or '(no outputs)'}",
        ]
        bad = [c for c in self.checks if not c.ok]
        for c in bad[:5]:
            lines.append(f"    {c.path}: {c.dtype}{list(c.shape)} error {c.error:.2g} "
                         f"> {c.tolerance:.2g}")
        if len(bad) > 5:
            lines.append(f"    ... and {len(bad) - 5} more leaves over tolerance")
        lines.extend(_loosened_lines(self.loosened))
        lines.append(f"compile {self.compile_s:.2f} s, run {self.run_s:.3f} s")
        lines.append("")
        head = f"{'per device':<18}{'measured':>14}"
        if has_est:
            head += f"{'estimated':>14}{'est/meas':>10}"
        lines.append(head)
        for label, measured, names in self._scalar_rows():
            if label == "flops":
                fmt = lambda x: f"{x:14.4g}"  # noqa: E731
                label_text = "flops"
            else:
                fmt = lambda x: f"{x / 2**20:10.3f} MiB"  # noqa: E731
                label_text = f"{label} memory"
            row = f"{label_text:<18}{fmt(measured)}"
            if has_est:
                est = _estimated(self.estimate, names)
                row += (fmt(est) if est is not None else f"{'-':>14}") + _ratio_text(est, measured)
            lines.append(row)
        lines.append("")
        collectives = self._collective_rows()
        head = f"{'collective':<22}{'mesh axes':<18}{'count':>7}{'bytes':>14}"
        if has_est:
            head += f"{'est. bytes':>14}{'est/meas':>10}"
        lines.append(head)
        if not collectives:
            lines.append("  (none)")
        for (kind, axes), (count, measured, est) in collectives.items():
            row = f"{kind:<22}{_axes_text(axes):<18}{count:>7}{measured:>14,}"
            if has_est:
                row += (f"{int(est):>14,}" if est is not None else f"{'-':>14}")
                row += _ratio_text(est, measured)
            lines.append(row)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"VerifyReport(ok={self.numerics_ok}, worst_error={self.worst_error:.2g} at "
                f"{self.worst_leaf!r}, peak_bytes={self.stats.peak_bytes}, "
                f"collectives={len(self.stats.collectives)}, plan={self.plan!r})")


def _loosened_lines(loosened: Sequence[LeafCheck], limit: int = 8) -> list[str]:
    """The ill-conditioned leaves, one line each: what they were checked at, and why."""
    if not loosened:
        return []
    lines = [f"ill-conditioned: {len(loosened)} output leaves move when the unsharded step's "
             f"inputs move by {PERTURBATION_ULPS} ulps; each is checked at {SPREAD_FACTOR:g} x "
             f"that spread instead of its dtype's tolerance:"]
    for c in loosened[:limit]:
        head = f"    {c.path}: {c.dtype}{list(c.shape)}"
        if math.isinf(c.tolerance):
            lines.append(f"{head} not compared (its non-finite entries move under the "
                         f"perturbation)")
            continue
        base = f"{c.base_tolerance:.0e}" if c.base_tolerance else "exact"
        lines.append(f"{head} spread {c.spread:.2g}, checked at {c.tolerance:.2g} "
                     f"(not {base}); error {c.error:.2g} {'ok' if c.ok else 'MISMATCH'}")
    if len(loosened) > limit:
        lines.append(f"    ... and {len(loosened) - limit} more ill-conditioned leaves")
    return lines


def _axes_text(axes) -> str:
    return ",".join(axes) if axes else "(no whole axes)"


def _ratio(est, measured) -> float | None:
    if est is None:
        return None
    if measured == 0:
        return 1.0 if est == 0 else math.inf
    return float(est) / float(measured)


def _ratio_text(est, measured) -> str:
    r = _ratio(est, measured)
    return f"{'-':>10}" if r is None else f"{r:10.2f}"


def _estimated(estimate, names: Sequence[str]) -> float | None:
    """The first of `names` that the estimate has as a number (defensive: any object)."""
    if estimate is None:
        return None
    for n in names:
        value = getattr(estimate, n, None)
        if value is None and isinstance(estimate, Mapping):
            value = estimate.get(n)
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
            return float(value)
    return None


def _estimated_collectives(estimate) -> dict[tuple[str, tuple[str, ...]], float]:
    """The estimate's `collective_bytes`, keyed (kind, axes) like `collective_summary()`; values
    may be numbers or objects with a `bytes` attribute; axes may be one name or a sequence."""
    if estimate is None:
        return {}
    raw = getattr(estimate, "collective_bytes", None)
    if raw is None and isinstance(estimate, Mapping):
        raw = estimate.get("collective_bytes")
    if not isinstance(raw, Mapping):
        return {}
    out: dict[tuple[str, tuple[str, ...]], float] = {}
    for key, value in raw.items():
        try:
            kind, axes = key
        except (TypeError, ValueError):
            continue
        axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
        value = getattr(value, "bytes", value)
        if isinstance(value, (int, float, np.integer, np.floating)):
            out[(str(kind), axes)] = out.get((str(kind), axes), 0.0) + float(value)
    return out


# --- verify ---------------------------------------------------------------------------------


def verify(fn, args: Sequence, plan, mesh, *, constraints: str = "compute", seed: int = 0,
           estimate: Any = None, tolerance: float | None = None,
           compiler_options: Mapping[str, Any] | None = None,
           kwargs: Mapping[str, Any] | None = None) -> VerifyReport:
    """Compile `plan` for `mesh` on simulated CPU devices, run it, and check it.

    fn: the function the plan's analysis traced (None: the traced function itself).
    args: its positional arguments, a tuple of pytrees of arrays or `jax.ShapeDtypeStruct`s
        (those are made concrete with `concrete_args(args, seed)`).
    plan, mesh: a Plan and the toast_lab Mesh it is for (mesh.size <= the CPU device count).
    constraints: plan.jit's constraint policy ("none", "conflicts", "compute", "all").
    estimate: a cost model's estimate to show next to XLA's numbers (any object; the report
        reads argument_bytes, output_bytes, temp_bytes, peak_memory_bytes, flops and
        collective_bytes = {(kind, axes): bytes} from it when present).
    tolerance: one relative error for every floating output leaf instead of TOLERANCES.
    compiler_options: XLA options for both compiles (default FAST_COMPILE).
    kwargs: the keyword arguments the function was traced with, if any.

    The sharded step and the unsharded `jax.jit(fn)` run on the same concrete arguments; every
    output leaf is compared (module docstring). A plan with decisions beyond sharding
    (`plan.step`: remat policies, micro-batches) runs the step plan.jit rewrites with them,
    so it is checked against the step as written, and XLA's memory and flops are the
    rewritten step's (flops: XLA counts a loop's body once, the micro-batch loop's too). The
    unsharded step runs once more, on its own compile, with the floating arguments moved by a
    few ulps (seeded by `seed`): each leaf is allowed a multiple of how far that moves it, and
    the leaves where this exceeds their dtype's tolerance are reported as ill-conditioned
    (`_sensitivity.py`). Returns a VerifyReport; it raises only where the plan cannot be
    compiled or run at all.
    """
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"tl.verify: args must be the tuple of positional arguments, e.g. "
                        f"(params, opt_state, batch); got {type(args).__name__}")
    prog = plan.analysis.program
    kwargs = dict(kwargs or {})
    check_args(prog, tuple(args), kwargs, "tl.verify",
               "Pass the arguments (or ShapeDtypeStructs) the analysis traced (for a zoo model, "
               "tl.zoo.sample(name, ...) with the same config), or analyse these arguments and "
               "plan for them.")
    args = tuple(concrete_args(tuple(args), seed))
    kwargs = concrete_args(kwargs, seed + 1)
    plan.validate(mesh)
    devices = _cpu_devices()
    jax_mesh = mesh.jax_mesh(devices)  # says how to simulate more devices when too few
    fn = prog.fn if fn is None else fn
    options = dict(FAST_COMPILE if compiler_options is None else compiler_options)

    step = plan.jit(fn, jax_mesh, constraints=constraints, compiler_options=options)
    in_shardings, _ = plan.shardings(jax_mesh)
    # Copies: plan.jit donates the training state, and device_put may reuse a buffer of
    # `args` as a shard (jax 0.10.2 does so even with may_alias=False), which the caller keeps.
    placed = jax.device_put(jax.tree.map(_fresh_copy, args), in_shardings)
    placed_kw = jax.device_put(kwargs, NamedSharding(jax_mesh, PartitionSpec()))
    start = time.perf_counter()
    compiled = step.lower(*placed, **placed_kw).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(compiled(*placed, placed_kw) if kwargs else compiled(*placed))
    run_s = time.perf_counter() - start

    reference = jax.jit(fn, compiler_options=options)
    if any(op.primitive == "shard_map" for op in prog.ops):
        # a shard_map inside the step runs on its own mesh's devices: replicate over the mesh
        # (every device computes the whole step, as one device would) instead of one device
        where = NamedSharding(jax_mesh, PartitionSpec())
    else:
        where = devices[0]

    def run_reference(a, kw):
        return jax.device_get(_key_data(
            reference(*jax.device_put(a, where), **jax.device_put(kw, where))))

    ref = run_reference(args, kwargs)
    # The same compiled reference on inputs moved by a few ulps: how much each leaf is noise.
    moved = run_reference(perturb_inputs(args, seed), perturb_inputs(kwargs, seed + 1))
    host, computed_in = jax.device_get(_key_data(out)), computed_in_tolerances(prog)
    checks = compare_outputs(host, ref, tolerance, perturbed=moved, computed_in=computed_in)
    if any(is_noise(c.base_tolerance, c.spread) for c in checks):
        # one sample of a noise leaf's heavy-tailed spread is not enough to size it: draw more
        more = [run_reference(perturb_inputs(args, seed + 2 * k),
                              perturb_inputs(kwargs, seed + 2 * k + 1))
                for k in range(1, RESAMPLES + 1)]
        checks = compare_outputs(host, ref, tolerance, perturbed=moved,
                                 computed_in=computed_in, resampled=more)
    worst = max(checks, key=lambda c: (c.ratio, c.error), default=None)
    return VerifyReport(
        numerics_ok=all(c.ok for c in checks),
        worst_error=worst.error if worst else 0.0,
        worst_leaf=worst.path if worst else "",
        tolerance=worst.tolerance if worst else 0.0,
        checks=checks,
        stats=read_compiled(compiled, jax_mesh),
        compile_s=compile_s,
        run_s=run_s,
        plan=plan,
        mesh=mesh,
        estimate=estimate,
    )


def _fresh_copy(x):
    return x.copy() if hasattr(x, "copy") else x


def _cpu_devices() -> list:
    """The CPU devices (simulated ones included); the default backend's where JAX has no CPU."""
    try:
        return list(jax.devices("cpu"))
    except RuntimeError:
        return list(jax.devices())
