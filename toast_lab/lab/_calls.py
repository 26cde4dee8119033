"""Scope paths for the ops a user did not scope: the chain of their function calls.

A step written in plain JAX (no `jax.named_scope`, no module library that adds one) gives every
op the same empty scope, and the graph would draw them all at the top. Its source still says
where each op came from: the Python functions that were running when JAX recorded it (backward
ops carry their forward op's frames; ops inside a library helper carry the user's call to it).
So the path of an unscoped op is its call chain below the step function, `loss_fn/rms` or
`chain/scale_by_adam` (a closure `scale_by_adam.<locals>.update_fn` is named by the function that
made it).

A Python loop over layers calls the same functions for every layer, so the frames cannot tell
the layers apart; the parameters can. An op that reads `params/layers/3/wq` is in layer 3 (an
"anchor"), and so is every op between two anchors of layer 3 in program order. The forward
pass visits the layers in one order and the backward pass in the other, so each layer is one or
two such runs. Ops between runs join the layer of the call they are part of (the norm before a
layer's first weight read), or else that of their operands (a residual add), or else that of
their users. An op reading a parameter of no layer (an embedding, a final norm) belongs to
none, which keeps a model's head out of its last layer. The layer is inserted where the loop
is: below the calls that all its ops share (`loss_fn/layers3/rms`).

A scope the user did name can hold too much to draw op by op (a LayerNorm's forward and
backward, an attention that computes its RoPE and softmax inline: a hundred ops). Its ops are
shown by the calls they came from below the calls they all share (`layer/attn/rope`), and
busy lines as groups, as for unscoped ops (`calls_within`).
"""

from __future__ import annotations

import linecache
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import NamedTuple

from ..program import INPUT, NO_OP, Program, call_name

PATH_INDEX = "\x00"   # marks a component whose index came from an argument path
_NO_LAYER = ""        # the label of ops that read a parameter of no layer
_DIGITS = re.compile(r"^\d+$")


class Calls(NamedTuple):
    """Per op of a program: its calls below the step function, outermost first, and the
    (file, line) of the user's code that made it (None in an installed package's code)."""

    chains: list[tuple[str, ...]]
    sites: list[tuple[str, int] | None]


def calls_of(program: Program) -> Calls:
    """Read once per program: the frames JAX recorded for each op."""
    return Calls(*_frames(program))


def call_paths(program: Program, ops: list[int], calls: Calls) -> dict[int, tuple[str, ...]]:
    """The path of each op in `ops` (those with no scope of the user's), below the step."""
    paths = {o: calls.chains[o] for o in ops}
    by_domain: dict[str, list[int]] = defaultdict(list)
    for o in ops:
        by_domain[paths[o][0] if paths[o] else ""].append(o)
    for members in by_domain.values():
        _insert_layers(program, paths, sorted(members))
    return _by_line(_named(collapse_chains(paths)), calls.sites)


def calls_within(calls: Calls, ops: list[int]) -> dict[int, tuple[str, ...]]:
    """The path of each op of one scope below it: its calls below those all the scope's ops
    share (`rope`, `rms_norm`), busy lines as groups; () for an op made by the shared calls
    on a quiet line."""
    chains = {o: calls.chains[o] for o in ops}
    shared = len(_common_prefix([c for c in chains.values() if c]))
    return _by_line(_named(collapse_chains({o: c[shared:] for o, c in chains.items()})),
                    calls.sites)


# --- frames ----------------------------------------------------------------------------------
# A component is a call: the function's name and the line that called it ("rms" + _LINE + "27"),
# so that two calls of one function from different lines (a block's two norms) stay apart.

_LINE = "\x01"


def _frames(program: Program):
    """Per op, its calls below the step function, outermost first; and the (file, line) of
    the user's code that made it (None in an installed package's code)."""
    from jax._src import source_info_util  # private, but the only way to JAX's user frames

    step = _code(program.fn)
    cache: dict[int, tuple] = {}
    chains, sites = [], []
    for op in program.ops:
        tb = getattr(op.source_info, "traceback", None)
        if tb is None:
            chains.append(((), False))
            sites.append(None)
            continue
        if id(tb) not in cache:
            try:
                frames = list(source_info_util.user_frames(tb))[::-1]  # outermost first
            except Exception:  # a layout is a courtesy: never let it break the Lab
                frames = []
            below = next((i + 1 for i, f in enumerate(frames) if step is not None and
                          (f.file_name, f.function_name) == step), None)
            site = frames[-1] if frames and not _installed(frames[-1].file_name) else None
            cache[id(tb)] = (_calls(frames[below or 0:], frames[below - 1].start_line
                                    if below else 0), below is not None,
                             site and (site.file_name, site.start_line))
        chain, found, site = cache[id(tb)]
        chains.append((chain, found))
        sites.append(site)
    if not any(found for _, found in chains):  # the step's frame is unknown: cut what all share
        prefix = len(_common_prefix([c for c, _ in chains if c]))
        return [c[prefix:] for c, _ in chains], sites
    return _rooted(program, chains), sites


def _calls(frames, called_at: int) -> tuple[str, ...]:
    chain: list[str] = []
    for f in frames:
        name = call_name(f.function_name, _installed(f.file_name))
        # recursion and a closure's own helpers stay one call
        if name and (not chain or _name(chain[-1]) != name):
            chain.append(f"{name}{_LINE}{called_at}")
        called_at = f.start_line
    return tuple(chain)


def _rooted(program: Program, chains) -> list[tuple[str, ...]]:
    """JAX keeps a bounded number of frames, so an op in a scan body may have lost the outer
    ones, the step's among them. Its chain continues that of its region op (the scan, which
    the step's function called), joined where the two overlap (`loss` + `loss/_layer/rope`);
    outside a region (a constant JAX hoisted out of a scan body), it is placed under the
    shallowest call of its first function that another chain shows."""
    out: list[tuple[str, ...]] = []
    known = []
    for op, (chain, found) in zip(program.ops, chains):
        if not found and chain and op.region != NO_OP:  # a region op precedes its body
            chain, found = _joined(out[op.region], chain), known[op.region]
        out.append(chain)
        known.append(found)
    where: dict[str, tuple[str, ...]] = {}
    for chain, found in zip(out, known):
        if found:
            for d, c in enumerate(chain):
                name = _name(c)
                if name not in where or len(where[name]) > d + 1:
                    where[name] = chain[:d + 1]
    for o, (chain, found) in enumerate(zip(out, known)):
        # outside any region (a constant JAX hoisted out of a scan body)
        if not found and chain and (head := where.get(_name(chain[0]))):
            out[o] = head + chain[1:]
    return out


def _joined(outer: tuple[str, ...], inner: tuple[str, ...]) -> tuple[str, ...]:
    """`outer` then `inner`, the longest end of `outer` that starts `inner` said once (by
    name: the truncated chain does not know the line its first call came from)."""
    for k in range(min(len(outer), len(inner)), 0, -1):
        if [_name(c) for c in outer[-k:]] == [_name(c) for c in inner[:k]]:
            return outer + inner[k:]
    return outer + inner


def _name(component: str) -> str:
    return component.split(_LINE)[0]


def _code(fn) -> tuple[str, str] | None:
    """(file, qualified name) of the traced function's code, through jit and partial."""
    for _ in range(8):
        inner = getattr(fn, "__wrapped__", None) or getattr(fn, "func", None)
        if inner is None:
            break
        fn = inner
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__call__", None), "__code__",
                                                     None)
    return (code.co_filename, code.co_qualname) if code is not None else None


def _installed(file_name: str) -> bool:
    """Whether a frame is in an installed package (optax, haiku), not the user's code. The
    zoo's models count as the user's wherever toast-lab is installed, so that they draw the
    same from a checkout and from site-packages."""
    if file_name.startswith(_ZOO):
        return False
    return "site-packages" in file_name or "dist-packages" in file_name


_ZOO = str(Path(__file__).resolve().parents[1] / "zoo")


def _named(paths: dict[int, tuple[str, ...]]) -> dict[int, tuple[str, ...]]:
    """Calls named by their function, and by their line where one parent calls a function
    from several lines: `rms (line 27)`, `rms (line 35)`."""
    lines: dict[tuple, set[str]] = defaultdict(set)
    for p in paths.values():
        for d, c in enumerate(p):
            if _LINE in c:
                name, line = c.split(_LINE)
                lines[(p[:d], name)].add(line)
    out = {}
    for o, p in paths.items():
        named = []
        for d, c in enumerate(p):
            if _LINE in c:
                name, line = c.split(_LINE)
                c = name if len(lines[(p[:d], name)]) == 1 else f"{name} (line {line})"
            named.append(c)
        out[o] = tuple(named)
    return out


def _common_prefix(paths: list[tuple[str, ...]]) -> tuple[str, ...]:
    """What every op shares: the caller of the step and the step itself."""
    if not paths:
        return ()
    first = paths[0]
    k = min(len(p) for p in paths)
    for p in paths[1:]:
        k = next((i for i in range(k) if p[i] != first[i]), k)
    return first[:k]


# --- layers of a Python loop ------------------------------------------------------------------

def _layer_key(name: str) -> tuple[str, str] | None:
    """('layers', '3') for 'params/layers/3/wq'; None for a parameter of no layer. The index
    is the last one in the path that follows a name: `opt_state/1/0/mu/emb` (indices into
    tuples of states) has none."""
    parts = name.split("/")
    for i in range(len(parts) - 1, 0, -1):
        if _DIGITS.match(parts[i]):
            return (parts[i - 1], parts[i]) if not _DIGITS.match(parts[i - 1]) else None
    return None


def _insert_layers(program: Program, paths: dict, seq: list[int]) -> None:
    """Inserts the layer of each op of one top-level call (`seq`, in program order) into its
    path, where the call reads a list of layers' parameters (module docstring)."""
    values = program.values
    anchors: list[tuple[int, tuple | None]] = []
    for o in seq:
        names = [values[v].name for v in program.ops[o].operands
                 if values[v].origin == INPUT and values[v].ndim > 0]
        if names:
            keys = {_layer_key(n) for n in names}
            anchors.append((o, keys.pop() if len(keys) == 1 else None))
    # The layers are the indices of the stem read most: a list of blocks, not a tuple of states.
    stems = Counter(k[0] for _, k in anchors if k is not None)
    if not stems:
        return
    stem = stems.most_common(1)[0][0]
    if len({k for _, k in anchors if k is not None and k[0] == stem}) < 2:
        return
    key = {o: (PATH_INDEX.join(k) if k is not None and k[0] == stem else _NO_LAYER)
           for o, k in anchors}
    label: dict[int, str] = dict(key)
    position = {o: i for i, o in enumerate(seq)}
    for (a, ka), (b, kb) in zip(list(key.items()), list(key.items())[1:]):
        if ka == kb and ka != _NO_LAYER:
            for o in seq[position[a] + 1:position[b]]:
                label[o] = ka
    _propagate(program, paths, seq, label)
    layered = [o for o in seq if label.get(o, _NO_LAYER) != _NO_LAYER]
    if not layered:
        return
    # The loop is below the calls every layer op shares; a layer is one call of its body.
    depth = len(_common_prefix([paths[o] for o in layered]))
    for o in layered:
        p = paths[o]
        paths[o] = p[:depth] + (label[o],) + p[depth:]


def _propagate(program: Program, paths: dict, seq: list[int], label: dict[int, str]) -> None:
    """Labels the ops between runs: first a whole call (one run of ops with one path, as the
    norm before a layer's first weight read), then from the operands (a residual add joins the
    layer whose output it adds; a backward pass follows the forward values it reads), then from
    the results' users. Only where those that have a label agree."""
    members = set(seq)
    values = program.values
    start = 0
    for i in range(1, len(seq) + 1):
        if i == len(seq) or paths[seq[i]] != paths[seq[start]]:
            run = seq[start:i]
            found = {label[o] for o in run if o in label}
            if len(found) == 1:
                layer = found.pop()
                for o in run:
                    label[o] = layer
            start = i
    for o in seq:
        if o not in label:
            found = {label[values[v].producer] for v in program.ops[o].operands
                     if values[v].producer in members and values[v].producer in label}
            if len(found) == 1:
                label[o] = found.pop()
    for o in reversed(seq):
        if o not in label:
            found = {label.get(u) for r in program.ops[o].results for u in program.users(r)
                     if u in members}
            if len(found) == 1 and None not in found:
                label[o] = found.pop()


# --- display ----------------------------------------------------------------------------------

LINE_SPLIT = 24   # a call with more ops than this shows its busy lines as groups
LINE_MIN = 3      # ... those lines that made at least this many ops
LINE_TEXT = 32    # characters of a line's source kept in its group's name


def _by_line(paths: dict[int, tuple[str, ...]], sites) -> dict[int, tuple[str, ...]]:
    """A function with many ops of its own (an attention written inline: forward and
    backward, a hundred ops) shows each of its busy lines as a group, named by its source:
    `o = jnp.einsum('bhqt,bthk->b… (line 31)`. The line is what the user wrote and can find."""
    by_path: dict[tuple, list[int]] = defaultdict(list)
    for o, p in paths.items():
        by_path[p].append(o)
    out = dict(paths)
    for path, members in by_path.items():
        if len(members) <= LINE_SPLIT:
            continue
        lines: dict[tuple, list[int]] = defaultdict(list)
        for o in members:
            if sites[o] is not None:
                lines[sites[o]].append(o)
        if len(lines) < 2:
            continue
        for (file, line), ops in lines.items():
            if len(ops) >= LINE_MIN:
                name = _line_name(file, line)
                for o in ops:
                    out[o] = path + (name,)
    return out


def _line_name(file: str, line: int) -> str:
    """Source text safe as a path component and in DOT: no '/', quotes single, and ending in
    ')' so that no digit at its end reads as a layer index."""
    text = " ".join(linecache.getline(file, line).split())
    text = text.replace("/", "\u2215").replace("\\", "\u2216").replace('"', "'")
    if len(text) > LINE_TEXT:
        text = text[:LINE_TEXT - 1] + "\u2026"
    return f"{text} (line {line})" if text else f"line {line} (source unavailable)"


def collapse_chains(paths: dict[int, tuple[str, ...]]) -> dict[int, tuple[str, ...]]:
    """A call with one callee and no ops of its own is drawn as its caller: optax's
    `chain/with_extra_args_support/scale_by_adam` as `chain/scale_by_adam`."""
    while True:
        ends: set[tuple] = set()
        nexts: dict[tuple, set[str]] = defaultdict(set)
        for p in paths.values():
            ends.add(p)
            for d in range(len(p)):
                nexts[p[:d]].add(p[d])
        single = {pre for pre, nx in nexts.items()
                  if len(nx) == 1 and pre and pre not in ends
                  and PATH_INDEX not in next(iter(nx))}
        # drop the only component under each such prefix, deepest first one at a time
        target = next((pre for pre in sorted(single, key=len, reverse=True)), None)
        if target is None:
            return paths
        d = len(target)
        paths = {o: (p[:d] + p[d + 1:] if p[:d] == target else p) for o, p in paths.items()}
