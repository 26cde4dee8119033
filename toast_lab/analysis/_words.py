"""The field's word for each class that a role or a shape pattern explains (DESIGN.md §3).

Read off the program's structure, for models traced without `dim_names` (a Hugging Face Flax
model, a Keras layer stack): the words are the ones MaxText, Megatron and flax's logical axis
rules use.

- `batch`, `seq`, `embed` (the residual width; `channels` where it is a convnet's): the roles
  (`find_roles`). `layers`: a scanned dim that state has (a stacked layer's parameters); `micro`:
  one that only data has (the micro-batches of gradient accumulation), whose inputs' leading dim
  (`micro_batched`) is the `global_batch`.
- attention: a `dot_general` of two data-derived values with a batch dim other than `batch` —
  those dims are `heads`; where its two free dims are one class and the contracting dim
  another (the scores `q·k`), the free class is `seq` (a ViT's patches) and the contracting
  one `head_dim` (of q and k); the other free dims of such dots are `head_dim` (of v). A
  reshape that merges two dims into one of `heads` (k and v repeated for grouped-query
  attention) has `kv_heads` as its major dim. A dim a reshape splits into (or merges from)
  heads and head_dim is the projection's: `heads` or `kv_heads` by its major part.
- `kv_groups`: the other dims merged into heads there (the query heads per kv head).
- `vocab`: a dim indexed by token ids — an embedding table's rows, gathered by indices computed
  from the data, and the logits' last dim, gathered by labels that have a sequence dim;
  `logits`: the same for labels without one (a classifier's output).
- a convolution: its feature dims are `channels`, its input's and output's spatial dims
  `height` and `width` (`length` in 1-D; `depth`, `height`, `width` in 3-D), its kernel's
  window `kernel_height` and `kernel_width`.
- `experts`: the group dim of a `ragged_dot_general`, or a batch dim of a contraction with a
  parameter (stacked expert weights).
- `features`: a data input's dim that a parameter contracts (an MLP's input features);
  `mlp`: the other feature classes on two weight matrices or more (a transformer's or an MLP's
  hidden dim, out of one weight and into the next);
  `positions`: a class made by an `iota` (position ids, a causal mask's positions), or the rows
  of a learned table indexed by them.

A class may fit several words; the first found wins, in the order of this list.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._domains import domains
from ._roles import feature_classes
from ..program import INPUT, NO_OP

_SPATIAL = {1: ("length",), 2: ("height", "width"), 3: ("depth", "height", "width")}
# Ops whose result is a copy of their first operand's values (a parameter cast for mixed
# precision, transposed or broadcast for a matmul).
_COPIES = frozenset({"convert_element_type", "copy", "transpose", "broadcast_in_dim",
                     "reshape", "squeeze", "expand_dims", "reduce_precision", "pjit"})


@dataclass(frozen=True)
class Word:
    """word: the field's name for a class. qualifier: what tells it from other classes with the
    same word, where the pattern knows (`qk`, `v`); primary: the class the word names bare
    when several have it (the role's class, the attention's own heads)."""

    word: str
    qualifier: str = ""
    primary: bool = False


def field_words(an, roles) -> dict[int, Word]:
    """{class id: Word} for the classes a role or a shape pattern explains."""
    words: dict[int, Word] = {}

    def put(c, word, qualifier="", primary=False):
        if c is not None and c >= 0 and c not in words:
            words[c] = Word(word, qualifier, primary)

    prog = an.program
    state = roles.state_inputs
    data = [v for v in prog.inputs if v not in state]
    from_data = _derived_from(prog, data)
    convs = _convolutions(an)
    put(roles.batch, "batch", primary=True)
    put(roles.sequence, "seq", primary=True)
    state_classes = {c for v in state for c in an.value_classes[v] if c >= 0}
    for c in sorted(roles.loops):
        put(c, "layers" if c in state_classes else "micro", primary=True)
    for c in roles.micro_batched:
        put(c, "global_batch", primary=True)
    if roles.width is not None:
        put(roles.width, "channels" if roles.width in convs["features"] else "embed",
            primary=True)
    _attention(an, from_data, roles.batch, words, put)
    _vocab(an, from_data, state, roles.batch, put)
    for c in sorted(convs["features"]):
        put(c, "channels")
    for c, word in sorted(convs["spatial"].items()):
        put(c, word)
    _experts(an, state, put)
    _features(an, data, state, put)
    _hidden(an, roles, put)
    for op, classes in zip(prog.ops, an.op_factor_classes):
        if op.primitive == "iota":
            for c in classes:
                put(c, "positions")
    return words


def _derived_from(prog, sources) -> set[int]:
    """The values computed from `sources` (and they themselves)."""
    seen = set(sources)
    frontier = list(sources)
    while frontier:
        v = frontier.pop()
        for o in prog.users(v):
            op = prog.ops[o]
            for r in (*op.results, *op.body):
                if r not in seen:
                    seen.add(r)
                    frontier.append(r)
    return seen


def _dots(an):
    """(op, rule, factor classes, lhs, rhs, (lc, rc), (lb, rb)) of each mapped dot_general."""
    for op, rule, classes in zip(an.program.ops, an.op_rules, an.op_factor_classes):
        if op.primitive == "dot_general" and not rule.fallback:
            (lc, rc), (lb, rb) = op.params["dimension_numbers"]
            yield op, rule, classes, op.operands[0], op.operands[1], (lc, rc), (lb, rb)


def _attention(an, from_data, batch, words, put) -> None:
    vc = an.value_classes
    heads: set[int] = set()
    attention = []
    for op, _, _, lhs, rhs, (lc, rc), (lb, rb) in _dots(an):
        if lhs not in from_data or rhs not in from_data:
            continue
        found = {vc[lhs][d] for d in lb} - {batch, -1}
        if not found:
            continue
        heads |= found
        free = ([vc[lhs][d] for d in range(len(vc[lhs])) if d not in lc and d not in lb],
                [vc[rhs][d] for d in range(len(vc[rhs])) if d not in rc and d not in rb])
        attention.append((op, {vc[lhs][d] for d in lc}, free))
    for c in sorted(heads):
        put(c, "heads", primary=True)
    # the scores q·k: one class on both free dims, softmaxed (the backward's dP = dO·v has
    # the same dims, and no softmax)
    scores = [(op, contracted, free[0][0]) for op, contracted, free in attention
              if len(free[0]) == 1 and free[0] == free[1] and free[0][0] not in contracted
              and _feeds(an.program, op.results[0], "exp")]
    for _, contracted, positions in scores:
        put(positions, "seq", primary=True)
    for _, contracted, _ in scores:
        for c in sorted(contracted):
            put(c, "head_dim", "qk")
    for _, contracted, free in attention:
        for c in sorted({*contracted, *free[0], *free[1]}):
            put(c, "head_dim", "v")
    keys = {op.operands[1] for op, _, _ in scores}
    _projections(an, heads, keys, words, put)


def _feeds(prog, v: int, primitive: str, depth: int = 6) -> bool:
    """Whether `v` reaches an op of `primitive` within `depth` ops."""
    frontier = [v]
    for _ in range(depth):
        nxt = []
        for u in frontier:
            for o in prog.users(u):
                if prog.ops[o].primitive == primitive:
                    return True
                nxt.extend(prog.ops[o].results)
        frontier = nxt
    return False


def _projections(an, heads, keys, words, put) -> None:
    """kv_heads (the major dim merged into heads: `k` where the merged value is the scores'
    keys, else `v`), then the projections' merged dims, then a fused projection split into
    them (`qkv`)."""
    prog = an.program
    kv: dict[int, str] = {}
    compounds = []
    for op, rule, classes in zip(prog.ops, an.op_rules, an.op_factor_classes):
        if op.primitive != "reshape" or rule.fallback:
            continue
        for dims_of, tensors in ((rule.operands, op.operands), (rule.results, op.results)):
            for dims, v in zip(dims_of, tensors):
                for d, factors in enumerate(dims):
                    if len(factors) < 2:
                        continue
                    whole = an.value_classes[v][d]
                    parts = [classes[f] for f in factors]
                    compounds.append((whole, parts))
                    if whole in heads and parts[0] not in heads:
                        side = "k" if _feeds_any(prog, op.results[0], keys) else "v"
                        kv.setdefault(parts[0], side)
    for c, side in sorted(kv.items()):
        put(c, "kv_heads", side)
    for whole, parts in compounds:
        if parts[0] in heads:
            put(whole, "heads")
        elif parts[0] in kv:
            put(whole, "kv_heads")
            if whole in heads:  # k and v repeated for each group of query heads
                for c in parts[1:]:
                    put(c, "kv_groups")
    for op in prog.ops:
        if op.primitive == "split":
            axis = op.params.get("axis", 0)
            pieces = {an.value_classes[r][axis] for r in op.results}
            if any(words.get(c, Word("")).word in ("heads", "kv_heads") for c in pieces):
                put(an.value_classes[op.operands[0]][axis], "qkv")


def _feeds_any(prog, v: int, targets, depth: int = 6) -> bool:
    frontier = [v]
    for _ in range(depth):
        if any(u in targets for u in frontier):
            return True
        frontier = [r for u in frontier for o in prog.users(u) for r in prog.ops[o].results]
    return False


def _vocab(an, from_data, state, batch, put) -> None:
    """Dims indexed by data-derived indices: an embedding table's rows, the logits' classes."""
    prog = an.program
    for op in prog.ops:
        if op.primitive != "gather" or len(op.operands) < 2:
            continue
        table, idx = op.operands[0], op.operands[1]
        if idx not in from_data:
            if _made_from(prog, idx, "iota") and _reads_state(prog, table, state):
                for d in getattr(op.params["dimension_numbers"], "start_index_map", ()):
                    if op.params["slice_sizes"][d] == 1:
                        put(an.value_classes[table][d], "positions")  # learned positions
            continue
        dims = op.params["dimension_numbers"]
        sizes = op.params.get("slice_sizes", ())
        # the dims whose rows are picked (a vmapped dynamic_slice also "indexes" the dims it
        # takes whole, at 0)
        indexed = tuple(d for d in getattr(dims, "start_index_map", ())
                        if d < len(sizes) and sizes[d] == 1)
        source = prog.outer_operand(table)
        for d in indexed:
            c = an.value_classes[table][d]
            if _reads_state(prog, source, state):
                put(c, "vocab")
            elif table in from_data:
                # the loss's gather of the labels' logits: an LM's labels have a sequence dim
                per_example = set(an.value_classes[idx]) - {batch, -1}
                put(c, "vocab" if per_example else "logits")


def _made_from(prog, v: int, primitive: str, depth: int = 6) -> bool:
    """Whether an op of `primitive` makes `v` within `depth` ops."""
    frontier = [v]
    for _ in range(depth):
        nxt = []
        for u in frontier:
            producer = prog.values[u].producer
            if producer == NO_OP:
                continue
            if prog.ops[producer].primitive == primitive:
                return True
            nxt.extend(prog.ops[producer].operands)
        frontier = nxt
    return False


def _reads_state(prog, v: int, state, depth: int = 4) -> bool:
    """Whether `v` is a state input, or a copy of one (a cast, a transpose, a broadcast)."""
    for _ in range(depth):
        if v in state:
            return True
        val = prog.values[v]
        if val.producer == NO_OP or val.origin == INPUT:
            return False
        op = prog.ops[val.producer]
        if op.primitive not in _COPIES or not op.operands:
            return False
        v = prog.outer_operand(op.operands[0])
    return v in state


def _convolutions(an) -> dict:
    features: set[int] = set()
    spatial: dict[int, str] = {}
    for op, rule, classes in zip(an.program.ops, an.op_rules, an.op_factor_classes):
        if op.primitive != "conv_general_dilated" or rule.fallback:
            continue
        lhs_spec, rhs_spec, out_spec = op.params["dimension_numbers"]
        lhs, rhs = op.operands[:2]
        vc = an.value_classes
        features.update(c for c in (vc[rhs][rhs_spec[0]], vc[rhs][rhs_spec[1]]) if c >= 0)
        names = _SPATIAL.get(len(lhs_spec) - 2, ())
        for d, word in zip(rhs_spec[2:], names):  # the kernel's window
            if vc[rhs][d] >= 0:
                spatial.setdefault(vc[rhs][d], f"kernel_{word}")
        for d, word in zip(lhs_spec[2:], names):
            if vc[lhs][d] >= 0:
                spatial.setdefault(vc[lhs][d], word)
        out = op.results[0]
        for d, word in zip(out_spec[2:], names):
            if vc[out][d] >= 0:
                spatial.setdefault(vc[out][d], word)
    return {"features": features, "spatial": spatial}


def _experts(an, state, put) -> None:
    for op, rule, classes in zip(an.program.ops, an.op_rules, an.op_factor_classes):
        if op.primitive == "ragged_dot_general" and not rule.fallback:
            dn = op.params["ragged_dot_dimension_numbers"]
            for d in getattr(dn, "rhs_group_dimensions", ()):
                put(an.value_classes[op.operands[1]][d], "experts")
    prog = an.program
    for op, _, _, lhs, rhs, _, (lb, rb) in _dots(an):
        for operand, dims in ((lhs, lb), (rhs, rb)):
            if _reads_state(prog, prog.outer_operand(operand), state, depth=2):
                for d in dims:
                    put(an.value_classes[operand][d], "experts")


def _hidden(an, roles, put) -> None:
    """The other feature classes of parameters: an MLP's hidden dims."""
    features = feature_classes(an)
    matrices: dict[int, int] = {}
    for v in domains(an).parameters:
        if an.program.values[v].ndim >= 2:
            for c in set(an.value_classes[v]):
                matrices[c] = matrices.get(c, 0) + 1
    for c in sorted(matrices):
        # out of one weight and into the next: a hidden dim (an input's features or a
        # classifier's outputs are on one weight only)
        if c in features and c not in roles.loops and matrices[c] >= 2:
            put(c, "mlp")


def _features(an, data, state, put) -> None:
    """A data input's dims that a parameter contracts (an MLP's input features)."""
    prog = an.program
    for op, _, _, lhs, rhs, (lc, rc), _ in _dots(an):
        for x, w, dims in ((lhs, rhs, lc), (rhs, lhs, rc)):
            if _reads_state(prog, prog.outer_operand(w), state, depth=2):
                for d in dims:
                    c = an.value_classes[x][d]
                    if any(c in an.value_classes[v] for v in data):
                        put(c, "features")
