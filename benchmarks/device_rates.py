"""This machine's accelerator measured the way a device preset states it, beside the cost model.

    python benchmarks/device_rates.py [--preset h100] [--quick] [--json FILE]

The cost model takes four rates from a preset (toast_lab/plan/_hardware.py): matmul FLOP/s by
shape, a fused attention kernel's FLOP/s, memory bandwidth, and collective bandwidth. Each is
measured here on the local JAX backend (device 0, or all local devices for collectives) with
the same jitted function the model is asked to cost: every row prints the model's time for
that function under the preset, the measured time, and their ratio. Then whole training
steps (zoo models at sizes that run in about a second) are timed on one device and compared
with `tl.estimate` twice: under the preset, and under the preset with its rates replaced by the
ones measured above. Nothing is fitted to the step times: the second column's rates come from
the microbenchmarks only, so its ratio says how well the model composes ops into a step.

On a GPU or TPU this is the calibration evidence the presets cite ("measured by
benchmarks/device_rates.py on ..."): run it there and copy the efficiencies it prints into an
`Efficiency(...)`. On a CPU it checks the same machinery against XLA:CPU (float32 matmuls, one
core's elementwise loops).

Timing: each function is compiled and run once, then timed `--reps` times after
block_until_ready; microbenchmarks report the fastest run (the rate the hardware reaches, as
mamf-finder does), steps the median.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import toast_lab as tl

# What each backend's preset defaults to, and the dtype its matmuls are measured in (CPUs have
# no bf16 matmul units: XLA:CPU converts, which measures the conversion, not the rate).
DEFAULT_PRESET = {"gpu": "h100", "tpu": "tpu-v5p", "cpu": "cpu"}
MATMUL_DTYPE = {"gpu": "bfloat16", "tpu": "bfloat16", "cpu": "float32"}

# (M, N, K): large square, Llama-7B MLP, a thin head dim, mid-size, few rows.
MATMUL_SHAPES = ((8192, 8192, 8192), (4096, 11008, 4096), (4096, 4096, 128),
                 (1024, 1024, 1024), (128, 4096, 4096))
MATMUL_SHAPES_CPU = ((2048, 2048, 2048), (1024, 2752, 1024), (1024, 1024, 128),
                     (512, 512, 512), (64, 1024, 1024))
# --grid: the matmul efficiency curve, by M (tokens), N and K (Llama-3-8B's projections, a
# GPT-2-sized layer, a head dim) in bf16, then float32 (TF32 where the backend uses it).
GRID_M = (128, 512, 2048, 8192, 32768)
GRID_NK = ((1024, 1024), (4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192), (128, 4096),
           (4096, 128), (3072, 768), (768, 3072))
GRID_F32 = ((8192, 8192, 8192), (4096, 4096, 4096), (2048, 2048, 2048))
# (batch, seq, heads, head dim) of causal attention, forward and backward.
ATTENTION_SHAPES = ((4, 4096, 32, 128), (8, 2048, 16, 128))
ATTENTION_SHAPES_CPU = ((1, 512, 4, 64),)

# Training steps: zoo model and config, per backend (sizes a device runs in about a second).
STEPS = {
    "cpu": (("gpt", dict(batch=8, seq=256, vocab=4096, embed=256, heads=8, layers=4)),
            ("gpt", dict(batch=4, seq=512, vocab=8192, embed=512, heads=8, layers=2)),
            ("llama", dict(batch=8, seq=256, vocab=4096, embed=256, heads=8, kv_heads=4,
                           mlp=768, layers=4)),
            ("moe", dict(batch=8, seq=128))),
    "accelerator": (("gpt", dict(size="gpt2-small", batch=8, dtype="bfloat16")),
                    ("gpt", dict(size="gpt2-medium", batch=8, dtype="bfloat16", remat=True)),
                    ("llama", dict(batch=4, seq=2048, vocab=32000, embed=2048, heads=16,
                                   kv_heads=8, mlp=5632, layers=8, dtype="bfloat16")),
                    # the same with cuDNN's flash attention (a GPU only)
                    ("llama", dict(batch=4, seq=2048, vocab=32000, embed=2048, heads=16,
                                   kv_heads=8, mlp=5632, layers=8, dtype="bfloat16",
                                   attention="cudnn")),
                    # about 1.1B parameters, float32 master weights, bf16 compute, remat
                    ("llama", dict(batch=8, seq=2048, vocab=32000, embed=2048, heads=16,
                                   kv_heads=8, mlp=5632, layers=22, compute_dtype="bfloat16",
                                   remat=True, attention="cudnn"))),
}


@dataclasses.dataclass(frozen=True)
class Row:
    """One measured function: its size, the model's time under the preset, what it took."""

    what: str
    work: float          # FLOPs (matmul, attention), bytes (memory, collectives)
    model_s: float
    measured_s: float

    @property
    def rate(self) -> float:
        return self.work / self.measured_s

    @property
    def ratio(self) -> float:
        return self.model_s / self.measured_s


def timed(fn, *args, reps: int) -> list[float]:
    """Seconds per call of jitted `fn` after one warm-up run (compile included there)."""
    jax.block_until_ready(fn(*args))
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        out.append(time.perf_counter() - start)
    return out


def kernel_seconds(fn, arg_sets, reps: int) -> float:
    """Seconds one call of `fn` takes on the device: `fn` on each of `arg_sets` (distinct
    inputs, so no run reads another's cached data or result) back to back in one executable,
    the fastest of `reps` runs. With 8 sets or more, the time of all less that of a quarter,
    over the difference in calls: the executable's dispatch (tens of microseconds a call, and
    more with many buffers) cancels, as it would not over the count alone."""
    def run(sets):
        many = jax.jit(lambda sets: [fn(*args) for args in sets])
        return min(timed(many, sets, reps=reps))

    if len(arg_sets) < 8:
        return run(arg_sets) / len(arg_sets)
    few = len(arg_sets) // 4
    return max(run(arg_sets) - run(arg_sets[:few]), 0.0) / (len(arg_sets) - few)


def _sets(make, nbytes: int, budget: int = 2 << 30, most: int = 16) -> list:
    """As many input sets as fit in `budget` bytes (2 to `most`), drawn by `make(seed)`; on an
    accelerator 16 GiB, for 8 sets or more (kernel_seconds' difference)."""
    if jax.default_backend() != "cpu":
        budget = 16 << 30
    count = int(max(2, min(most, budget // max(nbytes, 1))))
    return [make(seed) for seed in range(count)]


def compute_s(an, spec) -> float:
    """The cost model's compute time for an analysed step on one device described by `spec`."""
    return tl.estimate(an, tl.Plan.replicated(an), tl.Mesh({"data": 1}, device=spec)).compute_s


def model_time(fn, args, spec) -> float:
    """compute_s of `fn(*args)`."""
    return compute_s(tl.analyze(tl.trace(fn, *args)), spec)


def _random(shape, dtype, seed):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32).astype(dtype)


def matmuls(spec, shapes, dtype, reps) -> list[Row]:
    mm = lambda a, b: a @ b  # noqa: E731
    rows = []
    for m, n, k in shapes:
        size = (m * k + k * n + m * n) * np.dtype(dtype).itemsize
        sets = _sets(lambda seed: (_random((m, k), dtype, 2 * seed),
                                   _random((k, n), dtype, 2 * seed + 1)), size)
        rows.append(Row(f"matmul {m}x{n}x{k} {dtype}", 2.0 * m * n * k,
                        model_time(jax.jit(mm), sets[0], spec), kernel_seconds(mm, sets, reps)))
        print(f"  {rows[-1].what}: {rows[-1].measured_s * 1e3:.4f} ms", flush=True)
    return rows


def attention(spec, shapes, dtype, reps) -> list[Row]:
    """Causal jax.nn.dot_product_attention, forward and backward (cuDNN's kernel on a GPU,
    XLA's elsewhere). FLOPs as FlashAttention counts them: 4 b s^2 h d forward, 2.5 times that
    backward, half of it under the causal mask."""
    impl = "cudnn" if jax.default_backend() == "gpu" else None

    def loss(q, k, v):
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
        return o.astype(jnp.float32).sum()

    step = jax.grad(loss, argnums=(0, 1, 2))
    rows = []
    for b, s, h, d in shapes:
        sets = _sets(lambda seed: tuple(_random((b, s, h, d), dtype, 3 * seed + i)
                                        for i in range(3)),
                     3 * b * s * h * d * np.dtype(dtype).itemsize * 3, most=8)
        flops = 3.5 * 4.0 * b * s * s * h * d / 2
        rows.append(Row(f"attention b{b} s{s} h{h} d{d} {dtype} fwd+bwd", flops,
                        model_time(jax.jit(step), sets[0], spec),
                        kernel_seconds(step, sets, reps)))
    return rows


def memory(spec, nbytes, reps) -> list[Row]:
    """One read and one write of a float32 array (an elementwise kernel XLA cannot elide),
    then the same with an `exp` in it: the model costs both by their bytes, which holds where
    transcendentals run on units of their own faster than memory feeds them (a GPU's SFUs, a
    TPU's EUP) and not where they are a polynomial on the vector units (a CPU)."""
    sets = _sets(lambda seed: (_random((nbytes // 4,), jnp.float32, seed),), 2 * nbytes,
                 most=8)
    rows = []
    for what, f in (("elementwise", lambda x: x * 1.5 + 1.0),
                    ("exp", lambda x: jnp.exp(x * 0.5))):
        rows.append(Row(f"{what} {nbytes / 2**20:.0f} MiB f32 (read + write)", 2.0 * nbytes,
                        model_time(jax.jit(f), sets[0], spec), kernel_seconds(f, sets, reps)))
    return rows


def collectives(spec, nbytes, reps) -> list[Row]:
    """All-reduce and all-gather over every local device (shard_map), as bus bandwidth: what
    each device sends, 2 (n-1)/n of the buffer for an all-reduce, (n-1)/n for an all-gather."""
    devices = jax.local_devices()
    n = len(devices)
    if n < 2:
        return []
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((n,), ("d",), devices=devices,
                         axis_types=(jax.sharding.AxisType.Explicit,))
    x = jax.device_put(_random((n, nbytes // 4), jnp.float32, 0),
                       jax.sharding.NamedSharding(mesh, P("d")))
    link = spec.intra_node.bandwidth * spec.efficiency.collectives
    rows = []
    for name, body, moved in (
            ("all-reduce", lambda s: jax.lax.psum(s, "d"), 2.0 * (n - 1) / n),
            ("all-gather", lambda s: jax.lax.all_gather(s, "d", tiled=True), (n - 1) / n)):
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
        per_device = nbytes * moved if name == "all-reduce" else nbytes * n * moved
        rows.append(Row(f"{name} {nbytes / 2**20:.0f} MiB per device over {n}", per_device,
                        per_device / link, min(timed(f, x, reps=reps))))
    return rows


def launch_floor(spec, reps) -> list[Row]:
    """What a kernel costs beyond its work, run among others in one executable: a chain of
    dependent 128 x 128 x 128 matmuls (each needs the last one's result; 4 MFLOP, under a
    microsecond at peak), timed at two lengths, the difference over the extra kernels (so the
    executable's own dispatch cancels)."""
    w = [_random((128, 128), "bfloat16", seed) for seed in range(256)]
    x = _random((128, 128), "bfloat16", 999)

    def chain(n):
        def f(x, *w):
            for i in range(n):
                x = x @ w[i]
            return x
        return jax.jit(f)

    short, long = 64, 256
    t_short = min(timed(chain(short), x, *w[:short], reps=reps))
    t_long = min(timed(chain(long), x, *w[:long], reps=reps))
    per = (t_long - t_short) / (long - short)
    one = jax.jit(lambda a, b: a @ b)
    return [Row("kernel floor: one of 256 dependent 128x128x128 bf16 matmuls",
                2.0 * 128 ** 3, model_time(one, (x, w[0]), spec), per)]


def measured_spec(spec, rows_mm, rows_attn, rows_mem, dtype):
    """The preset with its rates replaced by the measured ones: peak = the preset's, or the
    fastest matmul where that is faster; matmul and attention efficiencies = measured / peak;
    memory bandwidth = the plain elementwise kernel's."""
    # (of the matmuls in `dtype`: --grid adds float32 ones, which run at another rate)
    others = tuple(d for d in MATMUL_DTYPE.values() if d != dtype)
    best = max(r.rate for r in rows_mm if not r.what.endswith(others))
    peak = max(spec.peak_flops[dtype], best)
    scale = peak / spec.peak_flops[dtype]
    flops = {k: v * scale for k, v in spec.peak_flops.items()}
    eff = spec.efficiency
    # (the rows time cuDNN's kernel on a GPU; elsewhere XLA's ops, which the model costs one by
    # one: nothing to replace)
    attention = min(1.0, max(r.rate for r in rows_attn) / peak) \
        if rows_attn and spec.platform == "gpu" else eff.attention
    # the measured bandwidth replaces the datasheet's, whole (Efficiency.memory 1)
    efficiency = dataclasses.replace(eff, matmul=min(1.0, best / peak), attention=attention,
                                     memory=1.0)
    bandwidth = rows_mem[0].rate if rows_mem else spec.memory_bandwidth  # the plain kernel
    return dataclasses.replace(spec, name=spec.name + "-measured", peak_flops=flops,
                               memory_bandwidth=bandwidth, efficiency=efficiency,
                               source=f"{spec.name}'s preset with the rates measured by "
                               "benchmarks/device_rates.py")


_NO_KERNEL = frozenset({"parameter", "get-tuple-element", "tuple", "bitcast", "constant",
                        "while", "conditional", "call", "after-all", "opt-barrier",
                        "partition-id", "replica-id"})


def kernel_count(hlo_text: str) -> int:
    """Instructions of a compiled module's own computations (not fusion bodies) that launch a
    kernel, each loop body counted once: fusions, library calls (cuBLAS, cuDNN), copies."""
    count, inside = 0, False
    for line in hlo_text.splitlines():
        head = line.lstrip()
        if line.endswith("{") and not line.startswith(" "):  # a computation's header
            inside = not head.startswith(("%fused", "fused", "%wrapped", "wrapped",
                                          "%region", "region", "%add", "%max", "%min"))
            continue
        match = re.search(r"=\s.*?\s([a-z][a-z0-9-]*)\(", head) if inside else None
        if match and match.group(1) not in _NO_KERNEL:
            count += 1
    return count


def steps(spec, measured, cases, reps) -> list[tuple]:
    """Each case's estimate (compute time and peak memory, under the preset and under the
    measured rates) beside its measured median step and what XLA compiled for it (argument +
    output + temp - alias bytes per device). Nothing is donated on either side."""
    out = []
    for name, cfg in cases:
        label = f"{name} ({', '.join(f'{k}={v}' for k, v in cfg.items())})"
        try:
            fn, fargs = tl.zoo.get(name, **cfg)
            sample = tl.zoo.sample(name, **cfg)
            an = tl.analyze(tl.trace(fn, *fargs))
            mesh = tl.Mesh({"data": 1}, device=spec)
            est = tl.estimate(an, tl.Plan.replicated(an), mesh, donate=False)
            step = jax.jit(fn)
            took = statistics.median(timed(step, *sample, reps=reps))
            exe = step.lower(*sample).compile()
            mem = exe.memory_analysis()
            print(f"{label}: {kernel_count(exe.as_text())} kernel launches in the compiled "
                  "module (loop bodies once)")
            compiled = (mem.argument_size_in_bytes + mem.output_size_in_bytes
                        + mem.temp_size_in_bytes - mem.alias_size_in_bytes)
        except Exception as err:  # noqa: BLE001 -- one case's failure must not hide the rest
            print(f"{label}: failed: {type(err).__name__}: {err}")
            continue
        out.append((label, len(an.program.ops), est.compute_s, compute_s(an, measured), took,
                    est.peak_memory_bytes, compiled))
    return out


def _table(rows: list[Row], unit: str, scale: float) -> None:
    print(f"| function | model (ms) | measured (ms) | model ÷ measured | measured {unit} |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.what} | {r.model_s * 1e3:.3f} | {r.measured_s * 1e3:.3f} | "
              f"{r.ratio:.2f} | {r.rate / scale:,.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default=None, help="device preset to compare with "
                        "(default: h100 on a GPU, tpu-v5p on a TPU, cpu on a CPU)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true",
                        help="one small shape of each kind and one step (a smoke run)")
    parser.add_argument("--json", default=None, help="also write the measurements here")
    parser.add_argument("--grid", action="store_true",
                        help="also measure the matmul efficiency curve (GRID_M x GRID_NK)")
    parser.add_argument("--no-steps", action="store_true", help="skip the training steps")
    args = parser.parse_args()

    platform = jax.default_backend()
    spec = tl.get_device(args.preset or DEFAULT_PRESET.get(platform, "cpu"))
    dtype = MATMUL_DTYPE.get(platform, "float32")
    on_cpu = platform == "cpu"
    mm_shapes = MATMUL_SHAPES_CPU if on_cpu else MATMUL_SHAPES
    attn_shapes = ATTENTION_SHAPES_CPU if on_cpu else ATTENTION_SHAPES
    cases = STEPS["cpu" if on_cpu else "accelerator"]
    # well past the last-level cache (32 MiB on a large CPU, 50 MiB of L2 on an H100)
    mem_bytes, coll_bytes = (256 * 2**20, 16 * 2**20) if on_cpu else (1 << 30, 256 * 2**20)
    if args.quick:
        mm_shapes, attn_shapes, cases = mm_shapes[-2:-1], attn_shapes[:1], cases[-1:]
        coll_bytes = 4 * 2**20
    device = jax.devices()[0]
    print(f"device: {device.device_kind} ({platform}, {jax.local_device_count()} local), "
          f"jax {jax.__version__}; preset {spec.name}: {spec.peak_flops[dtype] / 1e12:g} "
          f"TFLOP/s {dtype}, {spec.memory_bandwidth / 1e9:g} GB/s, efficiency "
          f"{spec.efficiency}\n")

    if args.grid and not on_cpu:
        grid = [(m, n, k) for m in GRID_M for n, k in GRID_NK]
        mm_shapes = tuple(dict.fromkeys((*mm_shapes, *grid)))
    rows_mm = matmuls(spec, mm_shapes, dtype, args.reps)
    if args.grid and not on_cpu:
        rows_mm += matmuls(spec, GRID_F32, "float32", args.reps)
    rows_attn = attention(spec, attn_shapes, dtype, args.reps)
    rows_mem = memory(spec, mem_bytes, args.reps)
    rows_floor = launch_floor(spec, args.reps) if not on_cpu else []
    rows_coll = collectives(spec, coll_bytes, args.reps)
    unit, scale = ("GFLOP/s", 1e9) if on_cpu else ("TFLOP/s", 1e12)
    print(f"Matmuls and {'cuDNN' if platform == 'gpu' else 'XLA'} attention:")
    _table(rows_mm + rows_attn, unit, scale)
    if rows_floor:
        print(f"\nKernel floor: {rows_floor[0].measured_s * 1e6:.2f} us per kernel "
              f"(model without a floor: {rows_floor[0].model_s * 1e6:.2f} us)")
    print("\nMemory and collectives (collectives: bus bandwidth; the model's time = bytes sent "
          "÷ the preset's link × its collective efficiency):")
    _table(rows_mem + rows_coll, "GB/s", 1e9)

    measured = measured_spec(spec, rows_mm, rows_attn, rows_mem, dtype)
    peak = measured.peak_flops[dtype]
    eff = measured.efficiency
    print(f"\nMeasured: peak {peak / scale:,.4g} {unit} {dtype} (the preset's, or the fastest "
          f"matmul where faster); Efficiency(matmul={eff.matmul:.3f}, attention="
          f"{eff.attention:.3f}); memory {measured.memory_bandwidth / 1e9:,.4g} GB/s, "
          f"Efficiency.memory={measured.memory_bandwidth / spec.memory_bandwidth:.3f} of the "
          "preset's")
    if rows_coll:
        print("collective efficiency measured: "
              + ", ".join(f"{r.what.split()[0]} {r.rate / spec.intra_node.bandwidth:.2f}"
                          for r in rows_coll) + " of the preset's link")

    results = [] if args.no_steps else steps(spec, measured, cases, max(3, args.reps // 2))
    print("\nTraining steps on one device (estimate ÷ measured; compute only, nothing sharded; "
          "memory: the estimate's peak ÷ what XLA compiled):")
    print("| step | ops | estimate, preset (ms) | estimate, measured rates (ms) | measured (ms) "
          "| preset ÷ measured | measured rates ÷ measured | peak est. ÷ XLA |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for what, ops, by_preset, by_measured, took, peak_est, compiled in results:
        print(f"| {what} | {ops} | {by_preset * 1e3:.1f} | {by_measured * 1e3:.1f} | "
              f"{took * 1e3:.1f} | {by_preset / took:.2f} | {by_measured / took:.2f} | "
              f"{peak_est / compiled:.2f} |")

    if args.json:
        doc = {"device": device.device_kind, "platform": platform, "jax": jax.__version__,
               "preset": spec.name, "dtype": dtype,
               "rows": [dict(dataclasses.asdict(r), rate=r.rate)
                        for r in rows_mm + rows_attn + rows_mem + rows_coll + rows_floor],
               "measured": {"peak_flops": peak, "memory_bandwidth": measured.memory_bandwidth,
                            **dataclasses.asdict(measured.efficiency)},
               "steps": [dict(step=w, estimate_preset_s=a, estimate_measured_s=b, measured_s=t,
                              peak_estimate_bytes=pk, compiled_bytes=c)
                         for w, _, a, b, t, pk, c in results]}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
