"""Each output leaf's own numerical sensitivity, measured on the unsharded reference.

Why. A sharded step sums in another order than the unsharded one, so the two agree only to
rounding. For most leaves that is 1e-7..1e-4 relative and a fixed tolerance per dtype works.
Some leaves are rounding noise through and through: a parameter whose exact gradient is zero
(a bias right before BatchNorm, which the normalization subtracts out; an attention key bias,
which softmax cancels per query) gets a computed gradient of pure rounding noise, and Adam
normalises it, m / (sqrt(v) + eps), into an update of up to learning-rate size with a random
sign. Two correct builds then differ on that parameter and its moments by O(100%): every
correct plan would fail. A floor at the step's scale (NOISE_FLOOR, as verify had) hides those
leaves, but it blinds the check to every small leaf: Adam's second moments sit at 1e-9..1e-7
next to a loss of ~5, so a floor of 1e-4 x that scale let a 100% error in them read as 0.1..3%.

What. The reference is run a second time on its own compile, with every floating input
multiplied by (1 + PERTURBATION_ULPS x eps(dtype) x r), r ~ N(0, 1) per element (seeded): each
entry moves by 8 ulps (one standard deviation) and keeps its sign; zeros stay zero. A leaf's
*spread* is the relative error of that run against the first (the same rule as the
comparison itself). Each leaf is then allowed

    max(dtype tolerance, SPREAD_FACTOR x spread)

and the leaves where the second term wins are reported as ill-conditioned, with what they were
checked at. The allowance comes from the trusted unsharded function only, so a broken sharded
build cannot widen its own tolerance.

The perturbation: 8 ulps. The sharded build's rounding differences behave like a perturbation
of the inputs of the size of the reordered sums' backward error, which for n terms is up to
(n-1)u and typically sqrt(n)u (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd
ed., SIAM 2002, sections 2.8 and 4.2; u = eps/2). Reductions in a training step run over
10^2..10^4 terms, so 10..100 u: 8 ulps = 16 u (9.5e-7 in float32, 1.8e-15 in float64) is that
size. Perturbing inputs at random to read how many digits of a result are significant is
Monte Carlo arithmetic (Parker, Pierce and Eggert, Comput. Sci. Eng. 2(4), 2000) and CESTAC
(Vignes, Numer. Algorithms 37, 2004). For a leaf that is noise, the size hardly matters: any
perturbation redraws its rounding. Floats narrower than 32 bits accumulate in float32 (XLA
upcasts them; matrix units accumulate in float32) and are rounded when stored, so their inputs
move by one of their own ulps (standard deviation, before rounding to the dtype). Weakly typed
leaves (Python scalars: a learning rate) stay as they are: an array in their place would change
the program's type promotion and force a new compile.

The factor: 8. For a noise-dominated leaf, with a, b, c the sharded, reference and perturbed
reference outputs, error / spread = ||a - b|| / ||c - b|| ~ sqrt((1 + rho^2) / 2) sqrt(F), where
rho is the ratio of the two builds' noise amplitudes (another summation order rounds
differently) and F an F(n, n) variable for n entries carrying the noise. Measured by
benchmarks/verify_sensitivity.py on 3 steps with zero-gradient parameters (a flax.nnx bias
before BatchNorm, a key bias under optax.adam, Keras 3's MultiHeadAttention from 3 seeds), 3
random plans on each of the meshes 8, 4x2 and 2x2x2 plus the 8..11 expert plans on 4x2, 2
perturbation seeds: over 564 comparisons of ill-conditioned leaves, error / spread was at most
5.5 (99th percentile 2.8, median 1.1; none failed at 8). A sample four times larger (10 random
plans per mesh, 4 seeds: `--plans 10 --seeds 4`, 2388 comparisons) gave the same maximum, 5.45
(99th percentile 2.7, median 1.2), so the tail seen is that one leaf, not a sample too small. The largest are Adam's second
moments, whose squared noise has heavy tails: the key bias's second moment on one random 4x2
plan is 4.8 off the reference, against spreads of 0.87..1.4 over perturbation seeds 0..3
(ratios 3.4..5.5). So 8 leaves a margin of about 1.5 over the worst case seen, which the larger
sample did not narrow; a larger factor would only loosen the check on noise leaves. It costs nothing
on well-conditioned leaves: their spreads are 1e-7..4e-4 (the largest in the zoo's tiny GPT),
so 8 x spread stays below float32's 1e-2 and their tolerance is unchanged; noise leaves have
spreads of 0.6..3, three orders of magnitude apart. A leaf that is noise is still checked, at
about 10: a NaN or inf where the reference has none, or values 20x too large, fail it.

More draws. One perturbed run is one sample of each entry's noise. For a leaf of many entries
that is enough (the F(n, n) argument above), but a leaf whose noise sits in a few entries (a
scalar that is pure rounding noise) would get its spread from one or two draws of a
heavy-tailed ratio. A bias before a softmax over the same axis has an exact gradient of 0,
computed as 2.4e-6 in float32: ten perturbation seeds move it by 0.06..0.97 (relative), and
correct plans by 0.03..0.98, so the one seed verify drew (0.06) failed five of nine correct
plans. Adam's second moment of such a bias is the squared noise, whose norm is carried by its
largest one or two entries whatever the leaf's size: a Keras CNN's 16-channel convolution bias
(before BatchNorm) read an error of 5.9 on a correct data-parallel plan against a one-draw
spread under 0.74 (ratio above 8; twelve other weight seeds gave spreads 1.2..2.0 and errors
0.7..3.1). So every leaf that the first run shows to be noise (its allowance above its
tolerance), whatever its size, gets RESAMPLES more perturbed runs and the largest of its
spreads: with five draws, a correct plan's noise exceeds 8 x their largest about as rarely as
a many-entry leaf's does with one. Only such leaves: they cost runs of the compiled reference,
no compile, and a well-conditioned step draws none.

Limits. The report shows every loosened leaf's spread. Integer and boolean leaves get the same
rule with their error (the fraction of entries that differ). A leaf whose non-finite entries
move under the perturbation cannot be compared at all: its allowance is inf, and the report
says so.
"""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np

# Relative size of the input perturbation, in ulps of each input's dtype (module docstring).
PERTURBATION_ULPS = 8
# Narrower floats (bfloat16, float16, float8) move by one of their own ulps.
NARROW_PERTURBATION_ULPS = 1
# Each leaf is allowed max(dtype tolerance, SPREAD_FACTOR x its spread) (module docstring).
SPREAD_FACTOR = 8.0
# A noise leaf takes the largest spread of 1 + RESAMPLES perturbed runs (module docstring,
# "More draws").
RESAMPLES = 4

# A second stream of the caller's seed: the perturbation never repeats concrete_args' draws.
_PERTURBATION_STREAM = 0x5E9


def perturb_inputs(args, seed: int = 0):
    """`args` with every floating array leaf multiplied by (1 + ulps x eps(dtype) x r),
    r ~ N(0, 1) per element from a numpy Generator seeded by `seed` (complex: both parts):
    8 ulps for 32- and 64-bit floats, 1 ulp for narrower ones. Zeros stay zero, signs stay.
    Integer, boolean and PRNG-key leaves, weakly typed leaves (Python scalars) and non-arrays
    are returned as they are. The result has the same dtypes, shapes and weak types, so a
    jitted function reuses its compile."""
    rng = np.random.default_rng([seed, _PERTURBATION_STREAM])

    def move(x):
        if not _perturbable(x):
            return x
        dtype = np.dtype(x.dtype)
        host = np.asarray(x)
        info = ml_dtypes.finfo(_real(dtype))
        work = np.float64 if info.bits > 32 else np.float32
        ulps = PERTURBATION_ULPS if info.bits >= 32 else NARROW_PERTURBATION_ULPS
        size = ulps * float(info.eps)

        def scaled(part):
            factor = 1 + size * rng.standard_normal(part.shape).astype(work)
            return part.astype(work) * factor

        if dtype.kind == "c":
            moved = scaled(host.real) + 1j * scaled(host.imag)
        else:
            moved = scaled(host)
        moved = moved.astype(dtype)
        return jax.numpy.asarray(moved) if isinstance(x, jax.Array) else moved

    return jax.tree.map(move, args)


def spread_allowance(tolerance: float, spread: float) -> float:
    """What a leaf is checked at: its dtype's `tolerance`, or SPREAD_FACTOR x the `spread`
    of the reference under perturbation where that is larger."""
    return max(float(tolerance), SPREAD_FACTOR * float(spread))


def is_noise(tolerance: float, spread: float) -> bool:
    """Whether a leaf's spread needs more draws: noise by the first."""
    return spread_allowance(tolerance, spread) > tolerance > 0


def _perturbable(x) -> bool:
    dtype = getattr(x, "dtype", None)
    if dtype is None or not hasattr(x, "shape"):
        return False  # Python scalars and other leaves: weakly typed or not arrays
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return False
    if getattr(x, "weak_type", False):
        return False
    dtype = np.dtype(dtype)
    return dtype.kind in "fc" or dtype in _ML_FLOATS


def _real(dtype: np.dtype) -> np.dtype:
    return np.dtype(dtype.type(0).real.dtype) if dtype.kind == "c" else dtype


_ML_FLOATS = {np.dtype(getattr(ml_dtypes, n)) for n in (
    "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e4m3b11fnuz", "float8_e4m3", "float8_e3m4", "float4_e2m1fn",
) if hasattr(ml_dtypes, n)}
