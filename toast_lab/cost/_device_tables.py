"""What one device's compiler makes of the program's ops: their rates, fusion, the partial sums
it adds before reducing, the workspace it allocates, the flops it counts (the `DeviceOps` that
_types.py compresses into op types), and the kernel's DEVICE record.

Each choice follows the device's CompilerProfile (_compiler.py): XLA:GPU and XLA:TPU
reassociate all-reduces, XLA:TPU fuses attention, XLA:CPU clones cheap producers into every
fusion and computes a top_k whole.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._fusion import launches, memory_traffic
from ._op_facts import select_and_scatter_pieces
from ._operand_rows import ROW_REPLICATE, ROW_RESULT
from ._tables import DEVICE


class DeviceOps(NamedTuple):
    """Per op of the program, as the device's compiler runs it ([N] arrays unless said):
    peak: FLOP/s of its dtype; io: the (op, value) pairs that move bytes
    (_fusion.memory_traffic); kernel and flop_scale: _fusion's kernel kind and the share of
    flops it runs; sum_leader: the op that reduces its partial sums (-1: itself); workspace:
    bytes allocated inside it; flops: counted as the compiler counts them; row_kind: [R] how
    the partitioner reads each operand row; launches: kernels it launches; fused: [V] values
    that never reach memory; pieces: workspace that outlives its op (_order.workspace_temps)."""

    peak: np.ndarray
    io: tuple
    kernel: np.ndarray
    flop_scale: np.ndarray
    sum_leader: np.ndarray
    workspace: np.ndarray
    flops: np.ndarray
    row_kind: np.ndarray
    launches: np.ndarray
    fused: np.ndarray
    pieces: list


def tensor_float32(op, dtype, dev) -> bool:
    """Whether a float32 matmul runs on the tensor cores as TF32: JAX's default precision
    lets XLA:GPU do so (an 8192^3 float32 dot ran at 384 TFLOP/s on an H100, 78% of the TF32
    peak and 5.7x the float32 one; benchmarks/device_rates.py --grid, jax 0.11.2); precision
    HIGHEST keeps float32 (jax_default_matmul_precision="highest" too: the trace records it
    in the dot's params)."""
    if dev.platform != "gpu" or "tensorfloat32" not in dev.peak_flops:
        return False
    if op.primitive not in ("dot_general", "conv_general_dilated") or dtype != np.float32:
        return False
    precision = op.params.get("precision")
    names = [str(p) for p in (precision if isinstance(precision, tuple) else (precision,))]
    return not any(k in n for n in names for k in ("HIGHEST", "FLOAT32", "F32_F32_F32"))


def peak_rates(prog, dev) -> np.ndarray:
    """[N] the FLOP/s each op runs at, by its first operand's dtype (TF32 where it applies)."""
    peak = np.empty(len(prog.ops))
    cache = {}
    for op in prog.ops:
        dt = prog.values[op.operands[0]].dtype if op.operands else np.dtype("float32")
        key = dt
        if tensor_float32(op, dt, dev):
            key = dt = "tensorfloat32"
        if key not in cache:
            try:
                cache[key] = dev.peak_flops_for(dt)
            except (ValueError, TypeError):  # PRNG keys and other extended dtypes
                cache[key] = dev.peak_flops_for("float32")
        peak[op.id] = cache[key]
    return peak


def device_ops(an, st, dev, compiler) -> DeviceOps:
    """The DeviceOps of analysis `an` (static tables `st`) on device `dev`."""
    prog = an.program
    # Fusion follows the device's compiler: XLA's attention fuses where its profile says so (a
    # shard_map's body and cuDNN's attention are kernels of their own everywhere)
    fused, kernel = st.passes.fused, st.passes.kernel_own
    if compiler.fuses_attention:
        fused, kernel = st.passes.fused | st.passes.attention_inside, st.passes.kernel
    leaders = st.passes.sum_leader if compiler.reassociates_all_reduce else \
        np.full(st.num_ops, -1, np.int64)
    workspace = st.ops.workspace if compiler.allocates_op_workspace else np.zeros(st.num_ops)
    pieces = []
    if compiler.allocates_op_workspace and compiler.schedules_breadth_first:
        pieces = select_and_scatter_pieces(prog)
        workspace = workspace.copy()
        workspace[[op for op, *_ in pieces]] = 0.0
    flops = st.flops.whole
    if compiler.clones_fused_producers:  # each copy after the first: the op's cloned flops
        flops = flops + st.flops.clone * (st.flops.fusion_copies - 1.0)
    # ops the compiler computes whole want their operands whole: all-gathered, as XLA does,
    # and the result sliced locally
    row_kind = st.rows.kind
    if not compiler.partitions_top_k:
        whole = st.ops.replicated_on_cpu[st.rows.op] & (st.rows.kind == ROW_RESULT)
        row_kind = np.where(whole, ROW_REPLICATE, st.rows.kind).astype(st.rows.kind.dtype)
    return DeviceOps(peak_rates(prog, dev), memory_traffic(prog, fused), kernel,
                     st.passes.flop_scale, leaders, workspace, flops, row_kind,
                     launches(prog, fused, kernel), fused, pieces)


def device_record(dev, compiler) -> np.ndarray:
    """The kernel's DEVICE record: the device's Efficiency, the bandwidth a streaming kernel
    reaches (Efficiency.memory of the datasheet's), whether reduce-scatters run as such."""
    e = dev.efficiency
    return np.array([(e.matmul, *map(float, e.tile), float(e.units), e.attention,
                      float(dev.memory_bandwidth) * e.memory, compiler.reduce_scatters,
                      e.launch_s)], DEVICE)
