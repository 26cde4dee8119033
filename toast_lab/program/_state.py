"""Which arguments are training state: a fact about the program, used by the cost model (state
bytes, donation) and by the expert strategies (which classes are parameters)."""

from __future__ import annotations

from collections import Counter


def state_inputs(prog) -> frozenset[int]:
    """The input values that the step returns updated (parameters, optimizer moments).

    An input is state when an output has its shape and dtype, matched in order. When the
    function returns none of its inputs (a forward pass, a loss), the leaves of its first
    positional argument are taken as the parameters. Scalars are never state.
    """
    outs = Counter((prog.values[v].shape, prog.values[v].dtype) for v in prog.outputs)
    state = []
    for v in prog.inputs:
        key = (prog.values[v].shape, prog.values[v].dtype)
        if outs[key] > 0 and prog.values[v].ndim > 0:
            outs[key] -= 1
            state.append(v)
    if not state:
        args = prog.in_tree.children()[0]  # in_tree is the treedef of (args, kwargs)
        firsts = args.children()
        n_first = firsts[0].num_leaves if firsts else 0
        state = [v for v in prog.inputs[:n_first] if prog.values[v].ndim > 0]
    return frozenset(state)
