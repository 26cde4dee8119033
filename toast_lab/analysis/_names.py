"""Readable, unique, deterministic class names (DESIGN.md §3), for any library's argument trees.

A class is named, in order of preference:
1. by the logical dim name given for an input in it (`dim_names`, the zoo's `batch`, `embed`),
   else by the logical axis name flax keeps on a parameter in it (`nnx.with_partitioning`,
   linen's `nn.Partitioned`: program/_annotations.py). A class named so was named by path
   before toast-lab read those; that name stays in `DimClass.formerly` for old plan files;
2. by the path of the first input in it and the dim: `attn/wq[1]`. Paths are cleaned of what
   says nothing — the argument's own name, haiku's `~` separators, flax.nnx's trailing `value`
   — and a long path is cut to its shortest suffix (two parts at least) that no other class
   shares: haiku's `res_net18/~/block_group_3/~/block_0/~/conv_0/w[3]` becomes
   `block_group_3/block_0/conv_0/w[3]`, or `conv_0/w[3]` where that is unique.
   A path of list indices only (Keras passes variables as lists: `state/0/8`) names a
   parameter by the name scope of the op that first reads it and the parameter's part in it:
   `multi_head_attention/query/kernel[1]`; a data input keeps its argument's name
   (`data/0[0]`), since the first op to read token ids is a bounds check, not a role.
3. by the op where the class first appears: its scope, primitive and dim (`attn/iota[0]`); an
   op with no scope is placed by the function that made it (`lru/pad[1]`), unless that is
   the traced step itself.

These are the path names. A class that none of 1 names but a role or a shape pattern explains
is then named by the field's word (`_field_names.py`); its path name stays a former name.
"""

from __future__ import annotations

from ..program import NO_OP, call_name, state_inputs

# The part an input plays in the first op that reads it, by (primitive, operand index).
_ROLE_BY_OPERAND = {
    ("dot_general", 1): "kernel", ("conv_general_dilated", 1): "kernel",
    ("ragged_dot_general", 1): "kernel", ("dot_general", 0): "input",
    ("conv_general_dilated", 0): "input", ("gather", 0): "table", ("gather", 1): "indices",
}
_ROLE_BY_PRIMITIVE = {"add": "bias", "add_any": "bias", "sub": "bias", "mul": "scale",
                      "div": "scale"}
# Ops that only pass a value on (a cast for mixed precision, a copy): look past them.
_PASS_ON = frozenset({"convert_element_type", "copy", "reshape", "broadcast_in_dim", "squeeze",
                      "transpose", "reduce_precision", "pjit", "device_put",
                      "sharding_constraint"})
_MIN_PARTS = 2  # a shortened path keeps at least this many parts


def class_names(program, members_by_class, first_parts
                ) -> tuple[list[tuple[str, tuple, str]], list[list[str]], list[bool]]:
    """(name, aliases, origin) per class, names not yet made unique across the analysis
    (`unique_name` does that for the rare op-labelled duplicates); the names earlier
    toast-labs gave the classes, which plan files saved then still hold: one list per era,
    newest first, with a name per class — before flax's annotations were read, and before
    `_told_apart` and before ops were placed by their function; and whether each class is
    named by a hint (`dim_names` or an annotation)."""
    input_index = {v: i for i, v in enumerate(program.inputs)}
    state = state_inputs(program)
    drafts = [_draft(program, mem, input_index, first, state)
              for mem, first in zip(members_by_class, first_parts)]
    names = _finish(_told_apart(program, drafts, members_by_class, input_index))
    plain, unannotated = drafts, names
    if any(n is not None for n in program.annotated_names):
        plain = [_draft(program, mem, input_index, first, state, annotated=False)
                 for mem, first in zip(members_by_class, first_parts)]
        unannotated = _finish(_told_apart(program, plain, members_by_class, input_index,
                                          annotated=False))
    earlier = [_unplaced(program, d, mem, first, input_index)
               for d, mem, first in zip(plain, members_by_class, first_parts)]
    eras = [[n for n, _, _ in unannotated], [n for n, _, _ in _finish(earlier)]]
    return names, eras, [d[0] == "hint" for d in drafts]


def _hint_tables(program, annotated: bool = True):
    """Per input, the dim names that may name its classes, in order of precedence: the user's
    `dim_names` first, then flax's annotations."""
    return (program.dim_names, program.annotated_names) if annotated else (program.dim_names,)


def _finish(drafts) -> list[tuple[str, tuple, str]]:
    """Drafts to (name, aliases, origin): a path keeps its shortest suffix no other class
    shares, and elides its middle where that suffix is long."""
    suffix_count: dict[tuple, int] = {}
    for kind, parts, dim, *_ in drafts:
        if kind == "path":
            for k in range(1, len(parts) + 1):
                key = (tuple(parts[-k:]), dim)
                suffix_count[key] = suffix_count.get(key, 0) + 1
    out = []
    for kind, parts, dim, aliases, origin in drafts:
        if kind != "path":
            out.append((parts, aliases, origin))
            continue
        k = min(_MIN_PARTS, len(parts))
        while k < len(parts) and suffix_count[(tuple(parts[-k:]), dim)] > 1:
            k += 1
        out.append([parts[-k:], dim, aliases, origin])
    # Where the part that tells two classes apart sits far from the end, elide the middle:
    # block_group_3/block_0/shortcut_batchnorm/mean_ema/average[3] ->
    # block_group_3/../mean_ema/average[3], when no other class would read the same.
    elided = [_elide(e[0]) if isinstance(e, list) else None for e in out]
    count: dict[tuple, int] = {}
    for e, short in zip(out, elided):
        if isinstance(e, list):
            key = (short or "/".join(e[0]), e[1])
            count[key] = count.get(key, 0) + 1
    names = []
    for e, short in zip(out, elided):
        if not isinstance(e, list):
            names.append(e)
            continue
        parts, dim, aliases, origin = e
        path = short if short and count[(short, dim)] == 1 else "/".join(parts)
        names.append((f"{path}[{dim}]", aliases, origin))
    return names


def _unplaced(program, draft, members, first_part, input_index):
    """The draft as it read before an unscoped op was placed by its function: `pad[1]`, not
    `lru/pad[1]`."""
    kind, parts, dim, aliases, origin = draft
    if kind != "path" or any(v in input_index for v, _ in members):
        return draft
    v = members[0][0] if members else first_part[0]
    return kind, op_parts(program, v, placed=False), dim, aliases, origin


def _told_apart(program, drafts, members_by_class, input_index, annotated: bool = True):
    """Classes that share a dim name (v's head_dim, which passes to the output projection,
    and q's and k's, which are contracted) are named by the parameters they shard:
    `head_dim(wk,wq)` and `head_dim(wo,wv)` (in argument order), not `head_dim` and
    `head_dim_1`; where those are the same names (one class per block), by the path that tells
    them apart: `channels(blocks/1)`."""
    by_hint: dict[str, list[int]] = {}
    for i, (kind, name, *_) in enumerate(drafts):
        if kind == "hint":
            by_hint.setdefault(name, []).append(i)
    out = list(drafts)
    for hint, shared in by_hint.items():
        if len(shared) < 2:
            continue
        paths = {i: _hinted_inputs(program, members_by_class[i], input_index, hint, annotated)
                 for i in shared}
        leaves = {i: ",".join(dict.fromkeys(p[-1] for p in paths[i])) for i in shared}
        if len(set(leaves.values())) < len(shared) and all(paths[i] for i in shared):
            leaves = _where_apart({i: paths[i][0] for i in shared})  # one per block
        for i in shared:
            if leaves[i]:
                kind, name, dim, aliases, origin = out[i]
                out[i] = (kind, f"{name}({leaves[i]})", dim, aliases, origin)
    return out


def _hinted_inputs(program, members, input_index, hint, annotated) -> list[list[str]]:
    """The paths of the inputs whose dim named `hint` is in the class, in argument order."""
    found = set()
    for table in _hint_tables(program, annotated):
        for v, d in members:
            names = table[input_index[v]] if v in input_index else None
            if names is not None and names[d] == hint:
                found.add((input_index[v], v))
    return [program.values[v].name.split("/") for _, v in sorted(found)]


def _where_apart(paths: dict[int, list[str]]) -> dict[int, str]:
    """Per path, the first part where the paths differ, with the name an index belongs to
    (`blocks/1`); '' where they do not differ."""
    k = 0
    while all(len(p) > k for p in paths.values()) and len({p[k] for p in paths.values()}) == 1:
        k += 1
    out = {}
    for i, p in paths.items():
        part = p[k:k + 1]
        if part and part[0].isdigit() and k > 0:
            part = [p[k - 1], part[0]]
        out[i] = "/".join(part)
    return out


def _elide(parts: list[str]) -> str | None:
    """'first/../last2' for paths of more than _MIN_PARTS + 2 parts, else None."""
    if len(parts) <= _MIN_PARTS + 2:
        return None
    return "/".join([parts[0], "..", *parts[-_MIN_PARTS:]])


def _draft(program, members, input_index, first_part, state, annotated: bool = True):
    """(kind, parts or name, dim, aliases, origin): kind "hint", "path" or "op"."""
    hints = []
    inputs = [(input_index[v], d, v) for v, d in members if v in input_index]
    for table in _hint_tables(program, annotated):
        for i, d, _ in inputs:
            names = table[i]
            if names is not None and names[d] is not None and names[d] not in hints:
                hints.append(names[d])
    first_input = (inputs[0][2], inputs[0][1]) if inputs else None
    if first_input is not None:
        v, d = first_input
        origin = f"{program.values[v].name}[{d}]"
    elif members:
        v, d = members[0]
        origin = op_label(program, v, d)
    else:  # only compound parts: named after the reshape that made them
        v, d, k = first_part
        origin = op_label(program, v, d) + f".{k}"
    if hints:
        return "hint", hints[0], None, tuple(hints[1:]), origin
    if first_input is not None:
        v, d = first_input
        parts = input_parts(program, v, v in state)
        return "path", _without_layer_index(program, parts, members, v, d), d, (), origin
    # named after the op: its user scope and primitive, shortened like a path
    k = None if first_input is not None or members else first_part[2]
    return "path", op_parts(program, v), d if k is None else f"{d}.{k}", (), origin


def _without_layer_index(program, parts: list[str], members, first: int, dim: int) -> list[str]:
    """`layers/w1` for a class holding the same dim of w1 in every layer (`layers/0/w1`,
    `layers/1/w1`): an index the class spans says nothing, and `0/w1` would read as layer 0's
    alone. A chain's link (dim 1 of `ws/17`, dim 0 of `ws/18`) keeps its index."""
    path = program.values[first].name.split("/")
    spanned = set()
    for v, d in members:
        if d != dim:
            continue
        other = program.values[v].name.split("/") if program.values[v].name else []
        if len(other) == len(path) and other != path:
            diff = [i for i, (a, b) in enumerate(zip(path, other)) if a != b]
            if len(diff) == 1 and path[diff[0]].isdigit() and other[diff[0]].isdigit():
                spanned.add(path[diff[0]])
    return [p for p in parts if p not in spanned] or parts


def input_parts(program, v: int, is_state: bool = True) -> list[str]:
    """The readable parts of an input's path (see the module docstring)."""
    path = program.values[v].name.split("/")
    arg, rest = path[0], path[1:]
    if len(rest) > 1 and rest[-1] == "value":  # flax.nnx Variables: params/dense/kernel/value
        rest = rest[:-1]
    rest = [p for p in rest if p not in ("~", "")]  # haiku: module/~/submodule
    if not rest:  # a bare array argument: its name is the path (`x`)
        return [arg]
    if any(not p.isdigit() for p in rest):
        return rest
    reader = reader_label(program, v) if is_state else ""
    if reader:
        return reader.split("/")
    return [arg, *rest] if arg else rest


def reader_label(program, v: int, depth: int = 4) -> str:
    """'scope/role' of the first op that reads `v` under a name scope, looking past casts and
    copies (mixed precision reads bf16 copies of float32 parameters); '' if none."""
    frontier = [v]
    for _ in range(depth):
        nxt = []
        for u in frontier:
            for o in program.users(u):
                op = program.ops[o]
                scope = op.user_scope
                if scope:
                    t = op.operands.index(u) if u in op.operands else -1
                    role = (_ROLE_BY_OPERAND.get((op.primitive, t))
                            or _ROLE_BY_PRIMITIVE.get(op.primitive) or op.primitive)
                    return f"{scope}/{role}"
                if op.primitive in _PASS_ON:
                    nxt.extend(op.results)
        frontier = nxt
        if not frontier:
            break
    return ""


def op_parts(program, v, placed: bool = True) -> list[str]:
    val = program.values[v]
    if val.producer == NO_OP:  # a constant the function captured
        return [f"const%{v}"]
    op = program.ops[val.producer]
    scope = op.user_scope
    if scope:
        return [*scope.split("/"), op.primitive]
    made_in = _function(op) if placed else ""
    # an op of the step itself needs no prefix; one in a function it calls is found there
    return [made_in, op.primitive] if made_in and made_in != program.fn_name else [op.primitive]


def _function(op) -> str:
    """The user's function whose line made an op with no scope (`lru` for a `pad` inside
    `def lru(...)`); '' where unknown or anonymous."""
    from jax._src import source_info_util  # private, but the only way to JAX's user frame

    try:
        frame = source_info_util.user_frame(getattr(op.source_info, "traceback", None))
    except Exception:  # a name is a courtesy: never let it break analysis
        return ""
    return call_name(frame.function_name) if frame is not None else ""


def op_label(program, v, d) -> str:
    val = program.values[v]
    if val.producer == NO_OP:  # a constant the function captured
        return f"const%{v}[{d}]"
    op = program.ops[val.producer]
    scope = f"{op.name_scope}/" if op.name_scope else ""
    return f"{scope}{op.primitive}[{d}]"
