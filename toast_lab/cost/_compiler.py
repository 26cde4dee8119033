"""Compiler profiles: which of XLA's passes the cost model follows, per backend.

A device says what the hardware is (peaks, memory, links: plan/_hardware.py); its `platform`
names the XLA backend that compiles for it. What that backend's pipeline does to a program
(which collectives it combines or decomposes, what it fuses, how it schedules) decides what
the step costs as much as the hardware does, so the cost model reads it here, one profile per
backend. Each behaviour below says what the backend does and how it was established: XLA:CPU's
against what XLA:CPU compiles (benchmarks/fidelity.py), the others from XLA's pass pipelines
and measurements on the devices where one is cited.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from ..plan import DeviceSpec


@dataclass(frozen=True)
class CompilerProfile:
    """What one XLA backend's pipeline does that the cost model follows.

    platform: the backend, "cpu", "gpu" or "tpu" (DeviceSpec.platform).
    reassociates_all_reduce: XLA adds partial sums before reducing them (AllReduceReassociate
        runs in the GPU and TPU pipelines; XLA:CPU's has no such pass and decomposes
        reduce-scatters).
    fuses_attention: jax.nn.dot_product_attention's XLA implementation (JAX's default) runs as
        one flash-attention kernel: assumed on TPUs (unmeasured); not on GPUs, where XLA runs
        its ops as written (measured on an H100, jax 0.11.2: a Llama step with it took 137 ms,
        61 ms with implementation="cudnn", whose custom call is costed as a flash kernel on
        every device: benchmarks/device_rates.py); nor on XLA:CPU.
    reduce_scatters: a reduce-scatter runs as one (XLA:CPU decomposes it into an all-reduce of
        the whole buffer and a slice).
    combines_all_reduces: XLA:CPU combines the step's independent all-reduces into one, so
        their partial sums wait for it (AllReduceCombiner; the GPU and TPU schedulers reduce
        them as they come).
    allocates_op_workspace: XLA:CPU allocates workspace inside some ops (convolutions,
        max-pool gradients); other compilers' kernels need none that the model counts.
    clones_fused_producers: XLA:CPU copies cheap elementwise ops into every fusion that reads
        them and runs each copy (cost_analysis() counts them); other compilers' fusion is not
        modelled so.
    schedules_breadth_first: XLA:CPU runs every op as soon as its operands are ready (its
        concurrency-optimised BFSMemoryScheduler, which it always takes for a module with
        collectives, in the step and in every loop body), so buffers live from their earliest
        possible op. It removes optimization barriers before it schedules, so a remat's
        recomputation runs in the forward pass and saves nothing outside a scanned stack's
        backward loop (measured: plan.jit's remat of an unrolled GPT, and jax.checkpoint,
        leave XLA:CPU's peak as it was). The GPU and TPU schedulers keep program order closer
        (the cost model's liveness follows program order there), and the GPU pipeline expands
        barriers only after scheduling: the recomputation stays in the backward pass.
    reduces_in_library: XLA:CPU runs large reductions as YNNPACK library fusions, which read
        the values they cannot take in from memory (a layer norm's x - mean): those are
        written, where a loop fusion would recompute them (_cpu_fusion.library_inputs).
    partitions_top_k: top_k is split by the SPMD partitioner (XLA:CPU lowers it to a TopK
        custom call the partitioner cannot split: it all-gathers the operand and computes it
        whole).
    """

    platform: str
    reassociates_all_reduce: bool
    fuses_attention: bool
    reduce_scatters: bool
    combines_all_reduces: bool
    allocates_op_workspace: bool
    clones_fused_producers: bool
    schedules_breadth_first: bool
    reduces_in_library: bool
    partitions_top_k: bool


PROFILES: Mapping[str, CompilerProfile] = MappingProxyType({
    "cpu": CompilerProfile(
        platform="cpu", reassociates_all_reduce=False, fuses_attention=False,
        reduce_scatters=False, combines_all_reduces=True, allocates_op_workspace=True,
        clones_fused_producers=True, schedules_breadth_first=True, reduces_in_library=True,
        partitions_top_k=False),
    "gpu": CompilerProfile(
        platform="gpu", reassociates_all_reduce=True, fuses_attention=False,
        reduce_scatters=True, combines_all_reduces=False, allocates_op_workspace=False,
        clones_fused_producers=False, schedules_breadth_first=False, reduces_in_library=False,
        partitions_top_k=True),
    "tpu": CompilerProfile(
        platform="tpu", reassociates_all_reduce=True, fuses_attention=True,
        reduce_scatters=True, combines_all_reduces=False, allocates_op_workspace=False,
        clones_fused_producers=False, schedules_breadth_first=False, reduces_in_library=False,
        partitions_top_k=True),
})


def compiler_profile(device_or_platform: DeviceSpec | str) -> CompilerProfile:
    """The profile of the XLA backend that compiles for a device (a DeviceSpec, by its
    `platform`) or of a platform named "cpu", "gpu" or "tpu"."""
    if isinstance(device_or_platform, DeviceSpec):
        platform = device_or_platform.platform
    elif isinstance(device_or_platform, str):
        platform = device_or_platform.strip().lower()
    else:
        raise TypeError(f"compiler_profile takes a DeviceSpec or a platform name "
                        f"({', '.join(PROFILES)}), got {type(device_or_platform).__name__} "
                        f"{device_or_platform!r}.")
    profile = PROFILES.get(platform)
    if profile is None:
        raise ValueError(f"No compiler profile for platform {platform!r}: the cost model "
                         f"follows XLA's {', '.join(PROFILES)} pipelines.")
    return profile
