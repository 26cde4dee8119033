"""Which arguments are training state: a fact about the program, used by the cost model (state
bytes, donation) and by the expert strategies (which classes are parameters)."""

from __future__ import annotations

from collections import Counter, defaultdict


def updated_pairs(prog) -> dict[int, int]:
    """{output value: the input value it returns updated}: the k-th input of a shape and dtype
    is returned as the k-th output of that shape and dtype (as jax matches donated buffers to
    outputs). Scalars never are."""
    outs = defaultdict(list)
    for v in prog.outputs:
        outs[(prog.values[v].shape, prog.values[v].dtype)].append(v)
    taken = Counter()
    pairs = {}
    for v in prog.inputs:
        key = (prog.values[v].shape, prog.values[v].dtype)
        if prog.values[v].ndim > 0 and taken[key] < len(outs[key]):
            pairs[outs[key][taken[key]]] = v
            taken[key] += 1
    return pairs


def updated_inputs(prog) -> frozenset[int]:
    """The input values that the step returns updated (parameters, optimizer moments): those a
    training loop donates (`updated_pairs`)."""
    return frozenset(updated_pairs(prog).values())


def state_inputs(prog) -> frozenset[int]:
    """The input values that are training state: the updated inputs, or, when the function
    returns none of its inputs (a forward pass, a loss), the leaves of its first positional
    argument, taken as the parameters. Scalars are never state."""
    state = updated_inputs(prog)
    if state:
        return state
    args = prog.in_tree.children()[0]  # in_tree is the treedef of (args, kwargs)
    firsts = args.children()
    n_first = firsts[0].num_leaves if firsts else 0
    return frozenset(v for v in prog.inputs[:n_first] if prog.values[v].ndim > 0)
