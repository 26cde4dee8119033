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
                                   kv_heads=8, mlp=5632, layers=8, dtype="bfloat16"))),
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


def compute_s(an, spec) -> float:
    """The cost model's compute time for an analysed step on one device described by `spec`."""
    return tl.estimate(an, tl.Plan.replicated(an), tl.Mesh({"data": 1}, device=spec)).compute_s


def model_time(fn, args, spec) -> float:
    """compute_s of `fn(*args)`."""
    return compute_s(tl.analyze(tl.trace(fn, *args)), spec)


def _random(shape, dtype, seed):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32).astype(dtype)


def matmuls(spec, shapes, dtype, reps) -> list[Row]:
    mm = jax.jit(lambda a, b: a @ b)
    rows = []
    for m, n, k in shapes:
        a, b = _random((m, k), dtype, 0), _random((k, n), dtype, 1)
        rows.append(Row(f"matmul {m}x{n}x{k} {dtype}", 2.0 * m * n * k,
                        model_time(mm, (a, b), spec), min(timed(mm, a, b, reps=reps))))
    return rows


def attention(spec, shapes, dtype, reps) -> list[Row]:
    """Causal jax.nn.dot_product_attention, forward and backward (cuDNN's kernel on a GPU,
    XLA's elsewhere). FLOPs as FlashAttention counts them: 4 b s^2 h d forward, 2.5 times that
    backward, half of it under the causal mask."""
    impl = "cudnn" if jax.default_backend() == "gpu" else None

    def loss(q, k, v):
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
        return o.astype(jnp.float32).sum()

    step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    rows = []
    for b, s, h, d in shapes:
        q, k, v = (_random((b, s, h, d), dtype, i) for i in range(3))
        flops = 3.5 * 4.0 * b * s * s * h * d / 2
        rows.append(Row(f"attention b{b} s{s} h{h} d{d} {dtype} fwd+bwd", flops,
                        model_time(step, (q, k, v), spec), min(timed(step, q, k, v, reps=reps))))
    return rows


def memory(spec, nbytes, reps) -> list[Row]:
    """One read and one write of a float32 array (an elementwise kernel XLA cannot elide),
    then the same with an `exp` in it: the model costs both by their bytes, which holds where
    transcendentals run on units of their own faster than memory feeds them (a GPU's SFUs, a
    TPU's EUP) and not where they are a polynomial on the vector units (a CPU)."""
    x = _random((nbytes // 4,), jnp.float32, 0)
    rows = []
    for what, f in (("elementwise", lambda x: x * 1.5 + 1.0),
                    ("exp", lambda x: jnp.exp(x * 0.5))):
        f = jax.jit(f)
        rows.append(Row(f"{what} {nbytes / 2**20:.0f} MiB f32 (read + write)", 2.0 * nbytes,
                        model_time(f, (x,), spec), min(timed(f, x, reps=reps))))
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


def measured_spec(spec, rows_mm, rows_attn, rows_mem, dtype):
    """The preset with its rates replaced by the measured ones: peak = the preset's, or the
    fastest matmul where that is faster; matmul and attention efficiencies = measured / peak;
    memory bandwidth = the plain elementwise kernel's."""
    best = max(r.rate for r in rows_mm)
    peak = max(spec.peak_flops[dtype], best)
    scale = peak / spec.peak_flops[dtype]
    flops = {k: v * scale for k, v in spec.peak_flops.items()}
    eff = spec.efficiency
    # (where attention is not fused, the model costs its ops one by one: nothing to replace)
    attention = min(1.0, max(r.rate for r in rows_attn) / peak) \
        if rows_attn and spec.fuses_attention else eff.attention
    efficiency = dataclasses.replace(eff, matmul=min(1.0, best / peak), attention=attention)
    bandwidth = rows_mem[0].rate if rows_mem else spec.memory_bandwidth  # the plain kernel
    return dataclasses.replace(spec, name=spec.name + "-measured", peak_flops=flops,
                               memory_bandwidth=bandwidth, efficiency=efficiency,
                               source=f"{spec.name}'s preset with the rates measured by "
                               "benchmarks/device_rates.py")


def steps(spec, measured, cases, reps) -> list[tuple]:
    out = []
    for name, cfg in cases:
        fn, fargs = tl.zoo.get(name, **cfg)
        sample = tl.zoo.sample(name, **cfg)
        an = tl.analyze(tl.trace(fn, *fargs))
        took = statistics.median(timed(jax.jit(fn), *sample, reps=reps))
        label = ", ".join(f"{k}={v}" for k, v in cfg.items())
        out.append((f"{name} ({label})", len(an.program.ops), compute_s(an, spec),
                    compute_s(an, measured), took))
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

    rows_mm = matmuls(spec, mm_shapes, dtype, args.reps)
    rows_attn = attention(spec, attn_shapes, dtype, args.reps)
    rows_mem = memory(spec, mem_bytes, args.reps)
    rows_coll = collectives(spec, coll_bytes, args.reps)
    unit, scale = ("GFLOP/s", 1e9) if on_cpu else ("TFLOP/s", 1e12)
    print(f"Matmuls and {'' if spec.fuses_attention else 'un'}fused attention:")
    _table(rows_mm + rows_attn, unit, scale)
    print("\nMemory and collectives (collectives: bus bandwidth; the model's time = bytes sent "
          "÷ the preset's link × its collective efficiency):")
    _table(rows_mem + rows_coll, "GB/s", 1e9)

    measured = measured_spec(spec, rows_mm, rows_attn, rows_mem, dtype)
    peak = measured.peak_flops[dtype]
    eff = measured.efficiency
    print(f"\nMeasured: peak {peak / scale:,.4g} {unit} {dtype} (the preset's, or the fastest "
          f"matmul where faster); Efficiency(matmul={eff.matmul:.3f}, attention="
          f"{eff.attention:.3f}); memory {measured.memory_bandwidth / 1e9:,.4g} GB/s")
    if rows_coll:
        print("collective efficiency measured: "
              + ", ".join(f"{r.what.split()[0]} {r.rate / spec.intra_node.bandwidth:.2f}"
                          for r in rows_coll) + " of the preset's link")

    results = steps(spec, measured, cases, max(3, args.reps // 2))
    print("\nTraining steps on one device (estimate ÷ measured; compute only, nothing sharded):")
    print("| step | ops | estimate, preset (ms) | estimate, measured rates (ms) | measured (ms) "
          "| preset ÷ measured | measured rates ÷ measured |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for what, ops, by_preset, by_measured, took in results:
        print(f"| {what} | {ops} | {by_preset * 1e3:.1f} | {by_measured * 1e3:.1f} | "
              f"{took * 1e3:.1f} | {by_preset / took:.2f} | {by_measured / took:.2f} |")

    if args.json:
        doc = {"device": device.device_kind, "platform": platform, "jax": jax.__version__,
               "preset": spec.name, "dtype": dtype,
               "rows": [dict(dataclasses.asdict(r), rate=r.rate)
                        for r in rows_mm + rows_attn + rows_mem + rows_coll],
               "measured": {"peak_flops": peak, "memory_bandwidth": measured.memory_bandwidth,
                            **dataclasses.asdict(measured.efficiency)},
               "steps": [dict(step=w, estimate_preset_s=a, estimate_measured_s=b, measured_s=t)
                         for w, _, a, b, t in results]}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
