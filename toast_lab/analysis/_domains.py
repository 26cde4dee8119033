"""Domains: which part of a training step each value belongs to, read off the program's
dataflow (never off names).

A published plan shards a class differently in different parts of the step: MaxText puts the
activations' `embed` on the tensor axis and the weights' `embed` on the FSDP axis; ZeRO-1/2
(Megatron's distributed optimizer) shards the optimizer state over the data-parallel devices
while the parameters stay replicated. A plan says so with per-domain overrides
(`Plan.with_axes(cls, axes, domain=...)`); this module says which domain each value is in.

- **activations**: values carrying an *activation class* — a class of the data inputs, or of
  values computed from the data alone, that no state input has (the batch, and the examples
  of each micro-batch it is split into; positions, when nothing learned is indexed by them).
- **compute**: the activations (forward and backward) and every value that feeds them and
  depends on the data: what the step computes per example.
- **parameters**: state inputs that feed the activations (what the forward reads), the values
  that feed the activations and are derived from parameters alone (casts, transposes,
  broadcasts of weights), and the updated parameters the step returns.
- **optimizer**: inputs that do not feed the activations (Adam's moments and step count: only
  the update reads them), and everything that feeds no activation — the weight gradients
  (contractions over the batch whose results carry only parameter classes), their sums, and
  the update computed from them and the state — except a loss or metric (a value without
  classes computed from the data), which is compute.

Region bodies (scan, while, cond) share their outer values' domains at the boundary: a body
input is in the domain of the operand it is bound to, a region result in that of the body
output it is bound to, so a domain boundary is always an ordinary op, where the cost model
charges the reshard and export constrains it.

A program without activation classes (no data input, or a batch of one) has only the trivial
split: state and its updated outputs are parameters, everything else is compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..program import BODY_INPUT, INPUT, state_inputs, updated_pairs

COMPUTE, PARAMETERS, OPTIMIZER = "compute", "parameters", "optimizer"
DOMAINS = (COMPUTE, PARAMETERS, OPTIMIZER)


@dataclass(frozen=True, eq=False)
class Domains:
    """The domain of every value of one analysis's program.

    of_value[v]: index into DOMAINS. parameters / optimizer_state: the state inputs of each
    kind. activation_classes: the classes that mark activations (see the module docstring).
    updated: {output value: the state input it returns updated}.
    """

    of_value: np.ndarray
    parameters: frozenset[int]
    optimizer_state: frozenset[int]
    activation_classes: frozenset[int]
    updated: dict

    def of(self, value: int) -> str:
        """The domain of `value`: "compute", "parameters" or "optimizer"."""
        return DOMAINS[self.of_value[value]]

    def values_in(self, domain: str) -> np.ndarray:
        return np.nonzero(self.of_value == domain_index(domain))[0]

    def __repr__(self) -> str:
        counts = np.bincount(self.of_value, minlength=len(DOMAINS))
        return ("Domains(" + ", ".join(f"{d}: {n} values" for d, n in zip(DOMAINS, counts))
                + f"; {len(self.parameters)} parameters, {len(self.optimizer_state)} "
                f"optimizer-state inputs)")


def domain_index(domain: str) -> int:
    try:
        return DOMAINS.index(domain)
    except ValueError:
        raise ValueError(f"no domain {domain!r}; domains: {list(DOMAINS)}") from None


def domains(an) -> Domains:
    """The Domains of `an`'s program, found once and kept with the analysis."""
    return an.derived("domains", lambda: find_domains(an))


def crossing_reads(an) -> frozenset[tuple[int, int]]:
    """(op id, operand value) of every read of one domain by an op that writes another (a
    weight read by a matmul, a gradient summed into the parameters' domain): plan.jit pins
    these reads where the plan reshards there, and the cost model follows what XLA does with
    a pinned read."""
    def find():
        prog = an.program
        of = domains(an).of_value
        out: set[tuple[int, int]] = set()
        for op in prog.ops:
            results = [r for r in op.results if prog.values[r].ndim]
            if op.body or not results:
                continue
            out.update((op.id, u) for u in op.operands
                       if prog.values[u].ndim and of[u] != of[results[0]])
        return frozenset(out)

    return an.derived("crossing_reads", find)


def domain_boundaries(an) -> frozenset[int]:
    """The values on either side of the ops that read one domain and write another: the
    results, and the operands from the other domain. Where a plan with per-domain overrides
    reshards, so plan.jit pins them and the cost model gathers a pinned relayout apart."""
    def find():
        prog = an.program
        out: set[int] = set()
        for n, u in crossing_reads(an):
            out.add(u)
            out.update(r for r in prog.ops[n].results if prog.values[r].ndim)
        return frozenset(out)

    return an.derived("domain_boundaries", find)


def find_domains(an) -> Domains:
    prog = an.program
    values = prog.values
    V = len(values)
    state = state_inputs(prog)
    updated = updated_pairs(prog)  # the state a step returns updated (none for a loss)
    data = [v for v in prog.inputs if v not in state]
    vc = an.value_classes
    succ, pred = _dataflow(prog)
    on_data = _closure(data, succ, V)
    # Classes of the data and of what is computed from it alone: a batch split into
    # micro-batches (a reshape, sliced by a scan) gives its examples a class of their own,
    # which the data input, holding them in one compound dim, does not have.
    data_only = np.nonzero(on_data & ~_closure(state, succ, V))[0]
    state_classes = {c for v in state for c in vc[v] if c >= 0}
    activation = frozenset(c for v in data_only for c in vc[v] if c >= 0) - state_classes
    of_value = np.zeros(V, np.int8)  # COMPUTE
    if not activation:
        params = frozenset(state)
        for v in params | set(updated):
            of_value[v] = DOMAINS.index(PARAMETERS)
        return Domains(of_value, params, frozenset(), activation, updated)

    carries = np.array([any(c in activation for c in vc[v.id]) for v in values], bool)
    feeds = _closure(np.nonzero(carries)[0], pred, V)        # activations and their ancestors
    params = frozenset(v for v in state if feeds[v])
    opt_state = frozenset(state) - params
    on_params = _closure(sorted(params), succ, V)
    for v in values:
        i = v.id
        if v.origin == INPUT:
            kind = (PARAMETERS if i in params else OPTIMIZER if i in opt_state
                    else COMPUTE if feeds[i] else OPTIMIZER)  # (Adam's scalar step count)
        elif not feeds[i]:
            # gradients and the update; a loss or metric (no class, from the data) is compute
            kind = COMPUTE if on_data[i] and all(c < 0 for c in vc[i]) else OPTIMIZER
        elif on_data[i] or not on_params[i]:
            kind = COMPUTE
        else:
            kind = PARAMETERS  # a weight prepared for the forward (cast, transposed, ...)
        of_value[i] = DOMAINS.index(kind)
    for out, inp in updated.items():
        if values[out].origin != INPUT and inp in params:
            for v in _made_in_bodies(prog, out):
                of_value[v] = DOMAINS.index(PARAMETERS)
    _share_across_regions(prog, of_value)
    return Domains(of_value, params, opt_state, activation, updated)


def _closure(seeds, edges, n) -> np.ndarray:
    """Every value reachable from `seeds` along `edges` (seeds included)."""
    seen = np.zeros(n, bool)
    stack = list(seeds)
    seen[stack] = True
    while stack:
        v = stack.pop()
        for w in edges[v]:
            if not seen[w]:
                seen[w] = True
                stack.append(w)
    return seen


def _dataflow(prog):
    """(successors, predecessors) of every value: an op's operands feed its results; a region
    op's operands feed the body inputs they are bound to, and body outputs feed the results
    (and, for loops, the carried body inputs) they are bound to."""
    succ = [[] for _ in prog.values]
    pred = [[] for _ in prog.values]

    def edge(a, b):
        succ[a].append(b)
        pred[b].append(a)

    for op in prog.ops:
        if not op.body:
            for u in op.operands:
                for r in op.results:
                    edge(u, r)
            continue
        for a, b in region_links(op):
            edge(a, b)
    return succ, pred


def region_links(op) -> list[tuple[int, int]]:
    """(source, destination) value pairs that a region op binds: outer operands to body inputs,
    body outputs to results and to the next iteration's carried inputs. The layout of `op.body`
    is the rules' (see rules/_control.py)."""
    ins, outs, body = op.operands, op.results, op.body
    links = []
    if op.primitive == "scan":
        nc, nk = op.params["num_consts"], op.params["num_carry"]
        n_in = len(ins)
        links += [(ins[i], body[i]) for i in range(n_in)]
        links += [(body[n_in + j], outs[j]) for j in range(len(outs))]
        links += [(body[n_in + j], body[nc + j]) for j in range(nk)]
    elif op.primitive == "while":
        cc, bc = op.params["cond_nconsts"], op.params["body_nconsts"]
        n = len(outs)
        links += [(ins[i], body[i]) for i in range(cc)]
        links += [(ins[cc + i], body[cc + n + i]) for i in range(bc)]
        for j in range(n):
            init, out = ins[cc + bc + j], body[cc + n + bc + n + j]
            for carried in (body[cc + j], body[cc + n + bc + j]):
                links += [(init, carried), (out, carried)]
            links.append((out, outs[j]))
    elif op.primitive == "cond":
        m, k = len(ins) - 1, len(outs)
        for b in range(len(op.params["branches"])):
            base = b * (m + k)
            links += [(ins[1 + i], body[base + i]) for i in range(m)]
            links += [(body[base + m + j], outs[j]) for j in range(k)]
        links += [(ins[0], r) for r in outs]  # the branch index decides every result
    else:  # REGION_PRIMITIVES has no other kind; if one is added, assume the worst
        links += [(u, r) for u in ins for r in outs]
    return links


def _made_in_bodies(prog, v: int) -> list[int]:
    """v, and where v is a region's result, the body outputs bound to it (nested regions'
    too): an update applied inside a cond (optax.apply_if_finite, MultiSteps) makes the new
    parameters in its branch, where the parameter domain starts as it does outside."""
    out, stack = [v], [v]
    while stack:
        w = stack.pop()
        op = prog.ops[prog.values[w].producer] if prog.values[w].producer >= 0 else None
        if op is None or not op.body:
            continue
        operands = set(op.operands)
        for a, b in region_links(op):
            if b == w and a not in operands and a not in out:
                out.append(a)
                stack.append(a)
    return out


def _share_across_regions(prog, of_value) -> None:
    """Body inputs take their operand's domain and results their body output's, so that no
    domain boundary falls on a region op (the cost model charges no reshard there). Repeated
    until nothing changes: one region's result can be another's operand."""
    values = prog.values
    regions = [op for op in prog.ops if op.body]
    links = {op.id: region_links(op) for op in regions}
    for _ in range(len(regions) + 1):
        before = of_value.copy()
        for op in regions:  # outer regions first: a nested body input sees its operand's
            outer = set(op.operands)
            for a, b in links[op.id]:
                if a in outer and values[b].origin == BODY_INPUT:
                    of_value[b] = of_value[a]
        for op in reversed(regions):  # inner regions first, for the results
            results, outer = set(op.results), set(op.operands)
            for a, b in links[op.id]:
                # (not a cond's branch index, which decides every result but is none of them)
                if b in results and a not in outer:
                    of_value[b] = of_value[a]
        if np.array_equal(before, of_value):
            return
