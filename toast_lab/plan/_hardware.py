"""Device presets: peak flops, memory and links of current accelerators (DESIGN.md §4).

Units are SI throughout: FLOP/s, bytes, bytes per second, seconds. Figures are dense (not
2:4-sparse) vendor datasheet numbers per chip. HBM capacities are binary (an "80 GB" H100 has
80 GiB of HBM, of which JAX can use a little less); bandwidths are decimal, as vendors quote
them.

A `Link` is what one device can push along one mesh axis, in one direction:

- NVIDIA: NVLink is quoted as total bidirectional bandwidth per GPU (H100: 900 GB/s), so one
  direction is half of it. Across nodes each GPU has its own InfiniBand NIC (400 Gb/s on
  H100/H200/B200 systems, 200 Gb/s on A100 systems).
- TPU: ICI is quoted as bidirectional bandwidth per chip over all its ports (4 ports on the 2D
  torus of v5e/v6e, 6 on the 3D torus of v4/v5p). A mesh axis laid along one torus dimension
  uses two ports (one each way round its ring), so its one-direction bandwidth is
  2 x (per-chip bidirectional / 2 / ports). Across slices, traffic goes over the data-center
  network (DCN), shared by the chips of a host.

Latencies are typical orders of magnitude (about a microsecond for NVLink and ICI hops, several
for InfiniBand and DCN), not datasheet figures; pass your own `Link` where they matter.

Peaks are not what a step reaches. `Efficiency` says, per device, what fraction of its peak
large matmuls, fused attention kernels and collectives reach and how matmuls tile; each
preset's `source` names where its figures come from (measurements by others: no constant
here is fitted to training step times). `benchmarks/device_rates.py` measures the same rates
on a local device, beside the model's time for each measured function, and prints the
`Efficiency` they give.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

GiB = 2**30

# The XLA backends a device can have.
PLATFORMS = ("gpu", "tpu", "cpu")

# The dtype names every preset must state a rate for.
REQUIRED_DTYPES = ("bfloat16", "float16", "float32")

# TPU MXUs have no float32 mode: a float32 matmul runs as several bfloat16 passes (1 at JAX's
# DEFAULT precision, 3 at HIGH, 6 at HIGHEST). We charge 3, the usual price of float32-accurate
# matmuls; give a DeviceSpec your own "float32" rate if you pin a precision.
TPU_FLOAT32_PASSES = 3

# Short and HLO-style spellings accepted by `DeviceSpec.peak_flops_for`.
_DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "f16": "float16",
    "fp16": "float16",
    "half": "float16",
    "f32": "float32",
    "fp32": "float32",
    "float": "float32",
    "single": "float32",
    "f64": "float64",
    "fp64": "float64",
    "double": "float64",
    "tf32": "tensorfloat32",
    "fp8": "float8",
    "f8": "float8",
    "s8": "int8",
    "i8": "int8",
    "u8": "uint8",
    "s4": "int4",
    "u4": "uint4",
    "c64": "complex64",
    "c128": "complex128",
    "pred": "bool",
}


def _check_number(what: str, value: Any, unit: str, allow_zero: bool = False) -> None:
    """A real, finite, positive (or, with allow_zero, non-negative) number, else an error naming
    `what`: a device's figures feed every estimate, where an infinity or a string would surface
    as a NaN or a TypeError far from here."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} must be a number ({unit}), got {type(value).__name__} "
                        f"{value!r}.")
    low = ">= 0" if allow_zero else "positive"
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{what} must be {low} and finite ({unit}), got {value!r}.")


def _integral(value: Any) -> bool:
    """A Python or NumPy integer (not a bool)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_count(what: str, name: str, value: Any, least: int) -> int:
    """`value` as an int (Python or NumPy integers) of at least `least`, else an error."""
    if not _integral(value) or value < least:
        raise ValueError(f"{what}: {name} must be an integer >= {least}, got {value!r}.")
    return int(value)


@dataclass(frozen=True)
class Link:
    """A mesh axis's interconnect, per device and per direction.

    bandwidth: bytes per second one device sends along the axis.
    latency: seconds per collective step (the alpha of an alpha-beta model).
    """

    bandwidth: float
    latency: float

    def __post_init__(self) -> None:
        _check_number("Link bandwidth", self.bandwidth, "bytes/s")
        _check_number("Link latency", self.latency, "seconds", allow_zero=True)

    def __repr__(self) -> str:
        return f"Link(bandwidth={self.bandwidth:.3g} B/s, latency={self.latency:.3g} s)"


@dataclass(frozen=True)
class Efficiency:
    """What fraction of its peak a device reaches, by kind of work.

    matmul: the large-matmul ceiling, a fraction of peak FLOP/s, at the best shapes.
    tile: (m, n, k) of the block the device computes in one step: a thread block's tile on a
        GPU, the MXU on a TPU (its LHS streams 8 rows at a time). A matmul's dims are padded up
        to whole tiles.
    units: how many tiles run at once (SMs on a GPU; 1 on a TPU, whose MXUs work on one tile
        stream); a matmul's tiles run in ceil(tiles / units) waves.
    attention: fraction of peak a fused (flash) attention kernel reaches.
    collectives: fraction of link bandwidth collectives reach on large messages.
    memory: fraction of the datasheet memory bandwidth a streaming (elementwise) kernel reaches.
    launch_s: the least time a kernel takes among others in a step (launch, ramp up and
        drain): a kernel with less work than that still costs it.
    """

    matmul: float = 1.0
    tile: tuple[int, int, int] = (1, 1, 1)
    units: int = 1
    attention: float = 1.0
    collectives: float = 1.0
    memory: float = 1.0
    launch_s: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.launch_s, bool) or not isinstance(
                self.launch_s, (int, float, np.integer, np.floating)) or not (
                0 <= self.launch_s < 1):
            raise ValueError(f"Efficiency.launch_s is seconds in [0, 1), got {self.launch_s!r}.")
        for name in ("matmul", "attention", "collectives", "memory"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(
                    value, (int, float, np.integer, np.floating)) or not 0 < value <= 1:
                raise ValueError(f"Efficiency.{name} is a fraction in (0, 1], got {value!r}.")
        tile, units = self.tile, self.units
        if (not isinstance(tile, (tuple, list)) or len(tile) != 3
                or not all(map(_integral, tile)) or min(tile) < 1 or not _integral(units)
                or units < 1):
            raise ValueError(f"Efficiency needs tile=(m, n, k) >= 1 and units >= 1, got "
                             f"tile={self.tile!r}, units={self.units!r}.")
        object.__setattr__(self, "tile", tuple(int(t) for t in tile))  # hashable
        object.__setattr__(self, "units", int(units))


# No losses: a roofline at the datasheet peaks (user-described devices, unless they say more).
IDEAL = Efficiency()


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator: what a roofline and an alpha-beta model need to know about it.

    name: the preset name, e.g. "h100-80gb".
    peak_flops: dtype name -> dense peak FLOP/s (bfloat16, float16 and float32 at least; also
        float8 / int8 / tensorfloat32 / float64 where the hardware has them).
    memory_bytes: HBM capacity per device, in bytes.
    memory_bandwidth: HBM bandwidth per device, in bytes per second.
    intra_node: the link between devices that share the fast interconnect (NVLink, ICI).
    inter_node: the link between devices that do not (InfiniBand, data-center network).
    devices_per_node: how many devices share the fast interconnect: 8 in an NVLink node; for
        TPUs the largest slice on one ICI network.
    source: where the numbers come from.
    efficiency: fractions of peak reached (see Efficiency); IDEAL reaches the peaks.
    torus_dims: for TPUs, the dimensions of the ICI torus (2 or 3): a mesh axis spanning
        several of them uses their links together. 0: a switched network (NVLink), where axes
        share each device's links.
    torus_wrap: the smallest torus side with wraparound links; a shorter ring is a line, with
        half the bandwidth.
    platform: "gpu", "tpu" or "cpu": the XLA backend that compiles for it, whose passes the
        cost model follows (its profile: toast_lab.cost.compiler_profile).
    """

    name: str
    peak_flops: Mapping[str, float]
    memory_bytes: int
    memory_bandwidth: float
    intra_node: Link
    inter_node: Link
    devices_per_node: int
    source: str = ""
    efficiency: Efficiency = IDEAL
    torus_dims: int = 0
    torus_wrap: int = 0
    platform: str = "gpu"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"DeviceSpec name must be a non-empty str, got {self.name!r}.")
        what = f"DeviceSpec {self.name!r}"
        if self.platform not in PLATFORMS:
            raise ValueError(f"{what}: platform must be one of {PLATFORMS}, "
                             f"got {self.platform!r}.")
        if not isinstance(self.peak_flops, Mapping):
            raise TypeError(f"{what}: peak_flops must map dtype names to FLOP/s, e.g. "
                            f"{{'bfloat16': 989e12, 'float16': 989e12, 'float32': 67e12}}, got "
                            f"{type(self.peak_flops).__name__} {self.peak_flops!r}.")
        flops = {}
        for k, v in self.peak_flops.items():
            _check_number(f"{what}: peak_flops[{k!r}]", v, "FLOP/s")
            flops[_canonical_dtype_name(k)] = float(v)
        missing = [d for d in REQUIRED_DTYPES if d not in flops]
        if missing:
            raise ValueError(
                f"{what} needs peak_flops for {', '.join(missing)}; "
                f"got {sorted(flops)}. Give each a rate in FLOP/s."
            )
        _check_number(f"{what}: memory_bytes", self.memory_bytes, "bytes per device")
        _check_number(f"{what}: memory_bandwidth", self.memory_bandwidth, "bytes/s")
        for field_name in ("intra_node", "inter_node"):
            link = getattr(self, field_name)
            if not isinstance(link, Link):
                raise TypeError(
                    f"{what}: {field_name} must be a toast_lab Link, e.g. "
                    f"Link(bandwidth=450e9, latency=2e-6) (bytes/s per direction, seconds), "
                    f"got {type(link).__name__} {link!r}"
                    + (f"; write Link(bandwidth={link[0]!r}, latency={link[1]!r})"
                       if isinstance(link, (tuple, list)) and len(link) == 2 else "")
                    + "."
                )
        object.__setattr__(self, "devices_per_node",
                           _check_count(what, "devices_per_node", self.devices_per_node, 1))
        if not isinstance(self.efficiency, Efficiency):
            raise TypeError(f"{what}: efficiency must be a toast_lab Efficiency (or IDEAL), got "
                            f"{type(self.efficiency).__name__} {self.efficiency!r}.")
        object.__setattr__(self, "torus_dims",
                           _check_count(what, "torus_dims", self.torus_dims, 0))
        object.__setattr__(self, "torus_wrap",
                           _check_count(what, "torus_wrap", self.torus_wrap, 0))
        # Read-only, so that a preset shared by every Mesh cannot be changed through one of them.
        object.__setattr__(self, "peak_flops", MappingProxyType(flops))

    def __hash__(self) -> int:
        return hash(
            (
                self.name,
                tuple(sorted(self.peak_flops.items())),
                self.memory_bytes,
                self.memory_bandwidth,
                self.intra_node,
                self.inter_node,
                self.devices_per_node,
                self.efficiency,
                self.torus_dims,
                self.torus_wrap,
                self.platform,
            )
        )

    def __reduce__(self):
        # A mappingproxy cannot be pickled; rebuild from a plain dict instead.
        return (
            DeviceSpec,
            (
                self.name,
                dict(self.peak_flops),
                self.memory_bytes,
                self.memory_bandwidth,
                self.intra_node,
                self.inter_node,
                self.devices_per_node,
                self.source,
                self.efficiency,
                self.torus_dims,
                self.torus_wrap,
                self.platform,
            ),
        )

    def __repr__(self) -> str:
        return (
            f"DeviceSpec({self.name!r}, bf16={self.peak_flops['bfloat16'] / 1e12:.4g} TFLOP/s, "
            f"memory={self.memory_bytes / GiB:.4g} GiB, "
            f"hbm={self.memory_bandwidth / 1e9:.4g} GB/s, "
            f"intra_node={self.intra_node.bandwidth / 1e9:.4g} GB/s, "
            f"inter_node={self.inter_node.bandwidth / 1e9:.4g} GB/s, "
            f"devices_per_node={self.devices_per_node})"
        )

    def peak_flops_for(self, dtype: Any) -> float:
        """Peak FLOP/s for arithmetic in `dtype` (a numpy/JAX dtype, or a name like "bf16").

        Falls back where the hardware has no dedicated rate: float8 and int4 run at the int8 /
        bfloat16 rate, other integers and bool at the float32 rate (vector units), complex at
        its real type's rate. float64 without a stated rate is an error (TPUs have none).
        """
        name = _canonical_dtype_name(dtype)
        for candidate in _fallbacks(name):
            if candidate in self.peak_flops:
                return self.peak_flops[candidate]
        raise ValueError(
            f"{self.name} has no peak flops for dtype {name!r} (it states "
            f"{', '.join(sorted(self.peak_flops))}). Use another dtype, or give the device "
            f"your own rate: dataclasses.replace(spec, peak_flops={{**spec.peak_flops, "
            f"{name!r}: ...}})."
        )


def _canonical_dtype_name(dtype: Any) -> str:
    """'bf16', jnp.bfloat16, np.dtype('float32') ... -> 'bfloat16', 'float32' ..."""
    if isinstance(dtype, str):
        name = dtype.strip().lower()
        name = _DTYPE_ALIASES.get(name, name)
        if name.startswith("f8") or name.startswith("float8"):
            return name if name.startswith("float8") else "float8_" + name[2:]
        return name
    try:
        return np.dtype(dtype).name
    except TypeError:
        raise TypeError(
            f"Cannot read a dtype from {dtype!r}; pass a numpy/JAX dtype or a name such as "
            f"'bfloat16'."
        ) from None


def _fallbacks(name: str) -> tuple[str, ...]:
    """Rates to try, best first, for a canonical dtype name."""
    if name.startswith("float8"):
        return (name, "float8", "int8", "bfloat16")
    if name in ("int8", "uint8", "int4", "uint4", "int2", "uint2"):
        return (name, "int8", "bfloat16")
    if name.startswith("float4"):
        return (name, "float4", "float8", "int8", "bfloat16")
    if name == "complex64":
        return ("complex64", "float32")
    if name == "complex128":
        return ("complex128", "float64")
    if name == "float64":
        return ("float64",)
    if name.startswith(("int", "uint", "bool")):
        return (name, "float32")
    return (name,)


# --- Presets -------------------------------------------------------------------------------


# Sources shared by the presets below.
# [MAMF] S. Bekman, ml-engineering, compute/accelerator/README.md "Maximum Achievable Matmul
#   FLOPS comparison table": the best bf16 matmul found by mamf-finder.py over many shapes
#   (H100 SXM 792.1 of 989 TFLOP/s = 80.1%, CUDA 12.1; A100 SXM 267.9 of 312 = 85.9%).
# [CUTLASS] NVIDIA/cutlass examples/48_hopper_warp_specialized_gemm: a 128x128x64 thread-block
#   tile, the tile of Hopper's bf16 GEMM kernels; one tile per SM at a time, so a GEMM runs in
#   ceil(tiles / SMs) waves (NVIDIA, "Matrix Multiplication Background User's Guide": tile and
#   wave quantization).
# [FA3] Shah et al., "FlashAttention-3", arXiv 2407.08608: 740 TFLOP/s forward in bf16 on H100,
#   75% of peak.
# [SB-GPU] Austin et al., "How to Scale Your Model", gpus.md (jax-ml/scaling-book): NVLink
#   all-reduce bus bandwidth on 8xH100 peaks near 370 of 450 GB/s (82%) on large messages.
# [SB-TPU] Austin et al., "How to Scale Your Model", tpus.md and sharding.md: ICI one-way
#   bandwidth per link (v4p 4.5e10, v5p 9e10, v5e 4.5e10, v6e 9e10 B/s), a bidirectional ring
#   on an axis with wraparound links, about 1 us per hop, DCN about 2.5e10 B/s per host, MXU
#   128x128 (256x256 on v6e) fed 8 LHS rows at a time, wraparound on v4/v5p axes that are
#   multiples of 4 and on v5e/v6e axes of 16; a measured ICI all-gather reached 560 of 680 us
#   (82%); profiling.md: a large bf16 matmul ran at the peak rate (96 ms for 95.6 expected).


def _tpu(
    name: str,
    *,
    bf16: float,
    int8: float | None,
    memory_gib: float,
    hbm: float,
    ici_link_one_way: float,
    torus_dims: int,
    torus_wrap: int,
    mxu: int,
    dcn_per_chip: float,
    slice_chips: int,
    source: str,
    fp8: float | None = None,
) -> DeviceSpec:
    flops = {"bfloat16": bf16, "float16": bf16, "float32": bf16 / TPU_FLOAT32_PASSES}
    if int8 is not None:
        flops["int8"] = int8
    if fp8 is not None:
        flops["float8"] = fp8
    return DeviceSpec(
        name=name,
        peak_flops=flops,
        memory_bytes=int(memory_gib * GiB),
        memory_bandwidth=hbm,
        # one torus dimension with wraparound: a bidirectional ring, both links of the axis
        intra_node=Link(bandwidth=2 * ici_link_one_way, latency=1e-6),
        inter_node=Link(bandwidth=dcn_per_chip, latency=10e-6),
        devices_per_node=slice_chips,
        source=source
        + f" float16 runs at the bf16 rate; float32 = bf16 / {TPU_FLOAT32_PASSES} (MXU passes)."
        " Efficiency: matmuls at peak on whole MXU tiles [SB-TPU profiling]; fused attention"
        " (splash) charged as matmuls at that rate (no published utilization found);"
        " collectives at 82% of the ICI rate [SB-TPU].",
        efficiency=Efficiency(matmul=1.0, tile=(8, mxu, mxu), units=1, attention=1.0,
                              collectives=0.82),
        torus_dims=torus_dims,
        torus_wrap=torus_wrap,
        platform="tpu",
    )


def _nvidia_notes(matmul: float, sms: int, measured: str | None) -> str:
    """What an NVIDIA preset's `source` says after its datasheet: the float32 rates, and
    where its Efficiency comes from (see `_nvidia`)."""
    return (
        " float32 is the non-tensor-core rate; tensorfloat32 the TF32 tensor-core rate (which"
        " float32 matmuls run at under JAX's default precision)."
        + (f" Efficiency: large matmuls at {matmul:.1%} of peak in 128x128x64 tiles over {sms}"
           f" SMs [CUTLASS], cuDNN flash attention (forward and backward) at"
           f" {HOPPER_ATTENTION:.0%}, elementwise kernels at {HOPPER_MEMORY:.0%} of the HBM"
           f" bandwidth, no kernel under {HOPPER_LAUNCH_S * 1e6:.1f} us, {measured}"
           " [H100-MEASURED]; collectives at 82% of link bandwidth"
           " [SB-GPU]." if measured else
           f" Efficiency: large matmuls at {matmul:.1%} of peak in 128x128x64 tiles over {sms}"
           " SMs [MAMF, CUTLASS], flash attention at 75% [FA3], the datasheet bandwidth,"
           " collectives at 82% of link bandwidth [SB-GPU].")
    )


def _nvidia(
    name: str,
    *,
    bf16: float,
    fp32: float,
    tf32: float,
    fp8: float | None,
    int8: float,
    fp64: float,
    memory_gib: float,
    hbm: float,
    nvlink_bidirectional: float,
    nic_bits_per_s: float,
    sms: int,
    matmul: float,
    source: str,
    measured: str | None = None,
) -> DeviceSpec:
    """An NVIDIA GPU in an 8-GPU NVLink node with one NIC per GPU. source: its datasheet's
    figures (the notes on rates and efficiencies are appended). measured: where the
    efficiencies were measured ([H100-MEASURED]); without it, large matmuls at `matmul`
    [MAMF], flash attention at FA3's forward rate and the datasheet bandwidth."""
    flops = {
        "bfloat16": bf16,
        "float16": bf16,
        "float32": fp32,
        "tensorfloat32": tf32,
        "int8": int8,
        "float64": fp64,
    }
    if fp8 is not None:
        flops["float8"] = fp8
    return DeviceSpec(
        name=name,
        peak_flops=flops,
        memory_bytes=int(memory_gib * GiB),
        memory_bandwidth=hbm,
        intra_node=Link(bandwidth=nvlink_bidirectional / 2, latency=2e-6),
        inter_node=Link(bandwidth=nic_bits_per_s / 8, latency=5e-6),
        devices_per_node=8,
        source=source + _nvidia_notes(matmul, sms, measured),
        efficiency=Efficiency(matmul=matmul, tile=(128, 128, 64), units=sms,
                              attention=HOPPER_ATTENTION if measured else 0.75,
                              collectives=0.82, memory=HOPPER_MEMORY if measured else 1.0,
                              launch_s=HOPPER_LAUNCH_S if measured else 0.0),
    )


# [H100-MEASURED] benchmarks/device_rates.py --grid on one H100 80GB HBM3 SXM (driver
#   580.159.04, jax 0.11.2 with its CUDA 13 plugin, 2026-11-24), each kernel timed back to back
#   on distinct inputs in one executable, the fastest of 5 runs:
#   - bf16 matmuls of M x 4096..14336 x 4096..14336 with M >= 8192 at 764-778 TFLOP/s, 78% of
#     989 (8192^3: 746-756; mamf-finder's best on another H100 was 80.1% [MAMF]);
#   - cuDNN causal attention, forward and backward (FlashAttention's flop count, masked half
#     skipped), b4 s4096 h32 d128 at 478-489 TFLOP/s, 48% (b8 s2048 h16: 363-373, 37%);
#   - an elementwise float32 kernel over 1 GiB (read + write) at 2306-2909 GB/s over six runs,
#     69-87% of 3350, median 2,487: 73% taken;
#   - a chain of dependent 128x128x128 bf16 matmuls (0.36 us of work each at the model's rate)
#     at 4.84 and 4.17 us a kernel in two runs: 256 of them less 64, over the 192 more (the
#     dispatch cancels); 4.5 taken.
#   The runs' outputs: benchmarks/results/h100-2026-11-24/.
#   Hopper siblings (H100 96GB, H200) share the chip: the same fractions.
HOPPER_MATMUL = 0.78
HOPPER_ATTENTION = 0.48
HOPPER_MEMORY = 0.73
HOPPER_LAUNCH_S = 4.5e-6
_H100_MEASURED = "measured on an H100 80GB"


TPU_V4 = _tpu(
    "tpu-v4",
    bf16=275e12,
    int8=275e12,
    memory_gib=32,
    hbm=1200e9,
    ici_link_one_way=4.5e10,
    torus_dims=3,
    torus_wrap=4,
    mxu=128,
    dcn_per_chip=2.5e10 / 4,
    slice_chips=4096,
    source="Cloud TPU v4 docs: 275 TFLOP/s bf16/int8, 32 GiB HBM2 at 1200 GB/s, 4096-chip pod, "
    "3D torus. ICI 4.5e10 B/s one way per link, DCN 2.5e10 B/s per 4-chip host [SB-TPU].",
)

TPU_V5E = _tpu(
    "tpu-v5e",
    bf16=197e12,
    int8=394e12,
    memory_gib=16,
    hbm=819e9,
    ici_link_one_way=4.5e10,
    torus_dims=2,
    torus_wrap=16,
    mxu=128,
    dcn_per_chip=2.5e10 / 8,
    slice_chips=256,
    source="Cloud TPU v5e docs: 197 TFLOP/s bf16, 394 TOP/s int8, 16 GiB HBM2 at 819 GB/s, "
    "256-chip pod (16x16 2D torus), 4 ICI ports. ICI 4.5e10 B/s one way per link, DCN "
    "2.5e10 B/s per 8-chip host [SB-TPU] (the host's 2 x 100 Gb/s NICs are its ceiling).",
)

TPU_V5P = _tpu(
    "tpu-v5p",
    bf16=459e12,
    int8=918e12,
    fp8=459e12,
    memory_gib=95,
    hbm=2765e9,
    ici_link_one_way=9e10,
    torus_dims=3,
    torus_wrap=4,
    mxu=128,
    dcn_per_chip=50e9 / 8,
    slice_chips=6144,
    source="Cloud TPU v5p docs: 459 TFLOP/s bf16 and fp8, 918 TOP/s int8, 95 GiB HBM2e at "
    "2765 GB/s, 3D torus, 50 Gb/s DCN per chip (= 2.5e10 B/s per 4-chip host [SB-TPU]); "
    "largest slice 6144 chips (pod 8960). ICI 9e10 B/s one way per link [SB-TPU] (the docs' "
    "1200 GB/s bidirectional per chip over 6 ports is 100 GB/s per link).",
)

TPU_V6E = _tpu(
    "tpu-v6e",
    bf16=918e12,
    int8=1836e12,
    memory_gib=32,
    hbm=1638e9,
    ici_link_one_way=9e10,
    torus_dims=2,
    torus_wrap=16,
    mxu=256,
    dcn_per_chip=2.5e10 / 8,
    slice_chips=256,
    source="Cloud TPU v6e (Trillium) docs: 918 TFLOP/s bf16, 1836 TOP/s int8, 32 GiB HBM at "
    "1638 GB/s, 256-chip pod (16x16 2D torus), 4 ICI ports, two 256x256 MXUs. ICI 9e10 B/s "
    "one way per link; DCN 2.5e10 B/s per 8-chip host [SB-TPU], a quarter of the 4 x 200 Gb/s "
    "NICs' line rate.",
)

A100_80GB = _nvidia(
    "a100-80gb",
    bf16=312e12,
    fp32=19.5e12,
    tf32=156e12,
    fp8=None,
    int8=624e12,
    fp64=19.5e12,
    memory_gib=80,
    hbm=2039e9,
    nvlink_bidirectional=600e9,
    nic_bits_per_s=200e9,
    sms=108,
    matmul=0.859,
    source="NVIDIA A100 datasheet (SXM4 80GB): 312 TFLOP/s bf16/fp16, 156 tf32, 19.5 fp32, "
    "624 TOP/s int8, 19.5 fp64 tensor core; 2039 GB/s HBM2e; NVLink 600 GB/s; 108 SMs; DGX "
    "A100 has one 200 Gb/s HDR InfiniBand NIC per GPU.",
)

H100_80GB = _nvidia(
    "h100-80gb",
    bf16=989e12,
    fp32=67e12,
    tf32=494.5e12,
    fp8=1979e12,
    int8=1979e12,
    fp64=67e12,
    memory_gib=80,
    hbm=3.35e12,
    nvlink_bidirectional=900e9,
    nic_bits_per_s=400e9,
    sms=132,
    matmul=HOPPER_MATMUL,
    measured=_H100_MEASURED,
    source="NVIDIA H100 datasheet (SXM5): dense 989 TFLOP/s bf16/fp16, 1979 fp8, 494.5 tf32, "
    "67 fp32, 67 fp64 tensor core; 80 GB HBM3 at 3.35 TB/s; NVLink 900 GB/s; 132 SMs; one "
    "400 Gb/s ConnectX-7 NIC per GPU (DGX H100).",
)

# The other Hopper parts: the H100 SXM5's chip, NVLink, NIC and measured efficiencies, with
# their own memory.
_HOPPER_NOTES = _nvidia_notes(HOPPER_MATMUL, H100_80GB.efficiency.units, _H100_MEASURED)

H100_96GB = replace(
    H100_80GB,
    name="h100-96gb",
    memory_bytes=96 * GiB,
    memory_bandwidth=2.4e12,
    source="H100 with 96 GB of HBM2e at 2.4 TB/s, the figures toast-lab's users quote for this "
    "part; we found no NVIDIA datasheet for it (the SXM5 datasheet lists 80 GB HBM3 at "
    "3.35 TB/s, the NVL 94 GB HBM3 at 3.9 TB/s); compute, NVLink and NIC as the H100 SXM5."
    + _HOPPER_NOTES,
)

H200 = replace(
    H100_80GB,
    name="h200",
    memory_bytes=141 * GiB,
    memory_bandwidth=4.8e12,
    source="NVIDIA H200 datasheet (SXM): H100 compute, 141 GB HBM3e at 4.8 TB/s, NVLink "
    "900 GB/s, one 400 Gb/s NIC per GPU; the H100 SXM's matmul ceiling [MAMF]."
    + _HOPPER_NOTES,
)

B200 = _nvidia(
    "b200",
    bf16=2.25e15,
    fp32=80e12,
    tf32=1.1e15,
    fp8=4.5e15,
    int8=4.5e15,
    fp64=40e12,
    memory_gib=180,
    hbm=8e12,
    nvlink_bidirectional=1.8e12,
    nic_bits_per_s=400e9,
    sms=148,
    matmul=0.734,
    source="NVIDIA HGX/DGX B200 datasheet, per GPU, dense: 2.25 PFLOP/s bf16/fp16, 4.5 fp8, "
    "1.1 tf32, 40 TFLOP/s fp64; 180 GB HBM3e at 8 TB/s; NVLink 5 1.8 TB/s; 148 SMs; one 400 "
    "Gb/s NIC per GPU. The fp32 (non-tensor) rate is approximate. Matmul ceiling: cuBLAS at "
    "1652 of 2250 TFLOP/s on 4096x8192x8192 bf16 (pyptx.dev/performance, CUDA 12.8).",
)

CPU = DeviceSpec(
    name="cpu",
    peak_flops={"bfloat16": 100e9, "float16": 100e9, "float32": 100e9, "float64": 50e9},
    memory_bytes=16 * GiB,
    memory_bandwidth=20e9,
    intra_node=Link(bandwidth=10e9, latency=5e-6),
    inter_node=Link(bandwidth=1.25e9, latency=50e-6),
    devices_per_node=1024,
    source="A modest host standing in for simulated devices "
    "(--xla_force_host_platform_device_count): a few cores' worth of SIMD per device, a share "
    "of DRAM bandwidth, and memcpy-speed links; every simulated device is on one node. "
    "XLA:CPU adds no partial sums across collectives (no AllReduceReassociate in its pipeline).",
    platform="cpu",
)

_PRESETS = (TPU_V4, TPU_V5E, TPU_V5P, TPU_V6E, A100_80GB, H100_80GB, H100_96GB, H200, B200,
            CPU)
_ALIASES = {"h100": H100_80GB, "a100": A100_80GB}

_DEVICES: Mapping[str, DeviceSpec] = MappingProxyType(
    {**{spec.name: spec for spec in _PRESETS}, **_ALIASES}
)


def devices() -> Mapping[str, DeviceSpec]:
    """All presets by name (aliases included, resolving to the same object); read-only."""
    return _DEVICES


def get_device(device: str | DeviceSpec) -> DeviceSpec:
    """A preset by name (case-insensitive), or the DeviceSpec itself."""
    if isinstance(device, DeviceSpec):
        return device
    if isinstance(device, str):
        spec = _DEVICES.get(device.strip().lower())
        if spec is not None:
            return spec
    raise ValueError(
        f"Unknown device {device!r}. Use one of {', '.join(sorted(_DEVICES))}, or describe your "
        f"own with toast_lab.DeviceSpec(...) (or dataclasses.replace(preset, ...))."
    )


# --- Plan files ------------------------------------------------------------------------------

# What a plan file records of a device besides its name (plan/_planfile.py): every figure the
# cost model reads (and, beside them, its `source`, which no comparison reads).
_LINK_FIELDS = ("bandwidth", "latency")
_EFFICIENCY_FIELDS = ("matmul", "tile", "units", "attention", "collectives")
_DEVICE_FIELDS = tuple(f.name for f in fields(DeviceSpec) if f.name not in ("name", "source"))


def _plain(x) -> int | float:
    return int(x) if isinstance(x, (int, np.integer)) else float(x)


def link_numbers(link: Link) -> dict[str, float]:
    """A Link as JSON values (`link_from_numbers` reads them back)."""
    return {"bandwidth": _plain(link.bandwidth), "latency": _plain(link.latency)}


def link_from_numbers(what: str, numbers: Any) -> Link:
    """The Link `link_numbers` recorded; TypeError / ValueError naming `what` otherwise."""
    _fields_of(what, numbers, _LINK_FIELDS)
    return Link(**numbers)


def device_numbers(spec: DeviceSpec) -> dict[str, Any]:
    """Every figure of `spec` but its name and source, as JSON values (`device_from_numbers`
    reads them back)."""
    eff = spec.efficiency
    return {
        "peak_flops": {k: _plain(v) for k, v in spec.peak_flops.items()},
        "memory_bytes": _plain(spec.memory_bytes),
        "memory_bandwidth": _plain(spec.memory_bandwidth),
        "intra_node": link_numbers(spec.intra_node),
        "inter_node": link_numbers(spec.inter_node),
        "devices_per_node": spec.devices_per_node,
        "efficiency": {"matmul": _plain(eff.matmul), "tile": list(eff.tile), "units": eff.units,
                       "attention": _plain(eff.attention),
                       "collectives": _plain(eff.collectives), "memory": _plain(eff.memory),
                       "launch_s": _plain(eff.launch_s)},
        "torus_dims": spec.torus_dims,
        "torus_wrap": spec.torus_wrap,
        "platform": spec.platform,
    }


def device_from_numbers(name: str, numbers: Any) -> DeviceSpec:
    """The device `device_numbers` recorded under `name` (with its "source", when recorded):
    the preset of that name when its figures are these (a plan for an H100 loads with the H100
    preset), else a DeviceSpec of that name with these figures (a preset changed with
    `dataclasses.replace` keeps the preset's name). Raises TypeError / ValueError naming a
    missing, unknown or bad field."""
    _fields_of("", numbers, _DEVICE_FIELDS, optional=("source",))
    links = {key: link_from_numbers(key, numbers[key]) for key in ("intra_node", "inter_node")}
    # (plan files written before Efficiency.memory have none: the bandwidth whole)
    _fields_of("efficiency", numbers["efficiency"], _EFFICIENCY_FIELDS,
               optional=("memory", "launch_s"))
    eff = dict(numbers["efficiency"])
    source = numbers.get("source", "")
    if not isinstance(source, str):
        raise TypeError(f"source must be a str (where the figures come from), got {source!r}.")
    spec = DeviceSpec(
        name=name,
        source=source,
        **links,
        efficiency=Efficiency(**eff),
        **{k: numbers[k] for k in _DEVICE_FIELDS
           if k not in ("intra_node", "inter_node", "efficiency")},
    )
    preset = _DEVICES.get(name.strip().lower())
    if preset is not None and device_numbers(preset) == device_numbers(spec):
        return preset
    return spec


def is_preset(spec: DeviceSpec) -> bool:
    """`spec` has the figures of the preset its name names (its name alone tells what it is)."""
    preset = _DEVICES.get(spec.name.strip().lower())
    return preset is not None and (preset is spec
                                   or device_numbers(preset) == device_numbers(spec))


def _fields_of(what: str, section: Any, expected: tuple[str, ...],
               optional: tuple[str, ...] = ()) -> None:
    """`section` is a mapping with the `expected` keys (and maybe the `optional` ones), else an
    error naming the missing and unknown keys (of `what`, when given)."""
    if not isinstance(section, Mapping):
        raise TypeError(f"{what or 'it'} must be an object with {', '.join(expected)}; got "
                        f"{type(section).__name__}.")
    missing = [k for k in expected if k not in section]
    unknown = [k for k in section if k not in expected + optional]
    if missing or unknown:
        raise ValueError((f"{what}: " if what else "") + "; ".join(
            ([f"missing {', '.join(map(repr, missing))}"] if missing else [])
            + ([f"unknown {', '.join(map(repr, unknown))}"] if unknown else []))
            + f" (expected {', '.join(expected)}).")
