"""What a collective over a set of mesh axes costs: one MESH record per axis mask.

A collective is priced by an alpha-beta model whose coefficients follow the network:

- Axes on the same kind of link form a *level* (an axis spanning nodes but several devices to
  a node is split into its part inside the nodes and its part across); a collective over
  several levels runs
  hierarchically, fastest level first: a reduce-scatter inside the fast axes leaves 1/n of
  the bytes for the slow ones (and an all-gather mirrors it). On GPUs NCCL pipelines the
  levels, so the slowest level decides ("How to Scale Your Model", gpus.md: the cost is the
  max over the levels of the tree); on TPUs XLA runs the ICI and DCN phases one after the
  other, so their times add.
- NVLink is a switch: the axes inside a node share each GPU's links. An ICI torus gives each
  torus dimension its own links: a mesh axis spanning several dimensions uses them together,
  and so do several axes of one collective; a torus side shorter than the wraparound length
  is a line with half the bandwidth (scaling book, tpus.md).
- Latency: a bidirectional ring on ICI takes ceil(n / 2) hops per dimension, the dimensions
  in parallel; NVLink rings take n - 1; across nodes and slices NCCL and XLA use trees (NCCL's
  tree all-reduce: 2 log2(nodes) network hops, src/graph/tuning.cc) and halving/doubling
  (NCCL's PAT all-gather), so log2(n) hops each way.
- Links reach Efficiency.collectives of their rate on large messages.

gather_beta: seconds per byte of the whole gathered (or to-be-scattered) buffer for an
all-gather or reduce-scatter; an all-reduce is a reduce-scatter and an all-gather.
a2a_beta: seconds per byte of one device's shard for an all-to-all.
permute_beta, permute_alpha: seconds per byte a device sends, and latency, of a
collective-permute (a shard_map's ppermute: a ring shift of a pipelined or ring-attention
kernel; a reshard XLA writes as one). It is point to point: each device sends its operand once, one hop, over one link in
one direction, all pairs at once (an ICI axis's Link counts both of its links, the two ways
round its ring: a shift takes one); the pair crossing the slowest link the axes span (another
node, for an axis spanning nodes) finishes last. Not modelled: a shift around a torus side
without wraparound, whose last pair crosses the whole line.
"""

from __future__ import annotations

import math

import numpy as np

from ._tables import MESH


def _parts(mesh) -> dict:
    """{axis: [(link, ways)]}: where each mesh axis's devices sit. An axis whose devices span
    nodes (or slices) but also lie several to a node is two parts: its devices inside a node,
    over the fast link, and the nodes, over the slow one (a ring or tree through them uses
    both, each node's NICs carrying their share)."""
    dev = mesh.device
    out = {}
    for a in mesh.axis_names:
        link, size = mesh.link(a), mesh.axis_size(a)
        inside = dev.devices_per_node // mesh.axis_stride(a)
        if link is dev.inter_node and a not in mesh.links and 1 < inside < size:
            out[a] = [(dev.intra_node, inside), (link, size // inside)]
        else:
            out[a] = [(link, size)]
    return out


def _levels(parts, axes):
    """[(link, [(axis, ways)])]: the parts of one collective's axes grouped by link."""
    groups: dict = {}
    for a in axes:
        for link, ways in parts[a]:
            groups.setdefault(link, []).append((a, ways))
    return list(groups.items())


def _torus_layout(mesh, parts) -> dict:
    """{ICI mesh axis: (torus dimensions it spans, its ring side)}: the slice (the devices of
    the ICI parts) taken as a torus of equal sides, the axes laid on whole dimensions from the
    minor one up, as jax's device meshes lay them; an axis too small for a whole dimension
    shares one."""
    dev = mesh.device
    ici = [(a, ways) for a in mesh.axis_names for link, ways in parts[a]
           if link is dev.intra_node]
    side = max(2.0, math.prod(w for _, w in ici) ** (1.0 / dev.torus_dims))
    left, out = dev.torus_dims, {}
    for a, size in reversed(ici):
        spans = max(1, min(left, round(math.log(size) / math.log(side)))) if size > 1 else 1
        left -= spans
        out[a] = (spans, size ** (1.0 / spans))
    return out


def _level_cost(mesh, link, members, efficiency, torus):
    """(ways, bandwidth B/s, latency s for one pass) of one level."""
    dev = mesh.device
    ways = math.prod(n for _, n in members)
    if link is dev.intra_node and dev.torus_dims:
        bandwidth, hops = 0.0, 0.0
        for axis, _ in members:
            spans, side = torus[axis]
            wraps = side >= dev.torus_wrap
            bandwidth += link.bandwidth * spans * (1.0 if wraps else 0.5)
            hops = max(hops, math.ceil(side / 2) if wraps else side - 1)
    elif link is dev.intra_node or link in mesh.links.values():
        bandwidth, hops = link.bandwidth, ways - 1.0
    else:
        bandwidth, hops = link.bandwidth, math.ceil(math.log2(ways))
    return ways, bandwidth * efficiency, hops * link.latency


def _one_way(mesh, link) -> float:
    """B/s one device sends to one neighbour over `link`: half an ICI axis's Link, whose
    bandwidth counts the links both ways round its ring (plan/_hardware._tpu)."""
    dev = mesh.device
    return link.bandwidth / 2.0 if link is dev.intra_node and dev.torus_dims else link.bandwidth


def collective_costs(mesh) -> tuple[np.ndarray, list]:
    """(MESH records indexed by axis mask, per mask {axis: share of its bandwidth time})."""
    names = tuple(mesh.axis_names)
    n = 1 << len(names)
    table = np.zeros(n, MESH)
    table["ways"] = 1.0
    shares: list = [{} for _ in range(n)]
    pipelined = mesh.device.torus_dims == 0  # NCCL pipelines levels; XLA on TPUs does not
    eff = mesh.device.efficiency.collectives
    parts = _parts(mesh)
    torus = _torus_layout(mesh, parts) if mesh.device.torus_dims else {}
    for m in range(1, n):
        axes = [a for i, a in enumerate(names) if m >> i & 1]
        levels = sorted((_level_cost(mesh, link, members, eff, torus) + (members,)
                         for link, members in _levels(parts, axes)), key=lambda x: -x[1])
        below = 1.0  # devices already reduced over by faster levels
        times, gather_alpha, a2a_beta = [], 0.0, 0.0
        links = [link for link, _ in _levels(parts, axes)]
        rec = table[m:m + 1]
        rec["permute_beta"] = max(1.0 / (_one_way(mesh, link) * eff) for link in links)
        rec["permute_alpha"] = max(link.latency for link in links)
        for ways, bandwidth, latency, members in levels:
            times.append(((ways - 1.0) / ways / below / bandwidth, members))
            gather_alpha += latency
            a2a_beta = max(a2a_beta, (ways - 1.0) / ways / bandwidth)
            below *= ways
        betas = [t for t, _ in times]
        beta = max(betas) if pipelined else sum(betas)
        rec["ways"] = below
        rec["gather_beta"] = beta
        rec["gather_alpha"] = gather_alpha
        rec["a2a_beta"] = a2a_beta
        total = sum(betas) or 1.0
        for t, members in times:  # the time of each level, split evenly over its axes
            for axis, _ in members:
                shares[m][axis] = shares[m].get(axis, 0.0) + t / total / len(members)
    return table, shares
