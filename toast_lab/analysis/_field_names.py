"""Class names from the field: the word a role or a shape pattern gives a class (`_words.py`),
told apart from the other classes with the same word by what distinguishes them.

A class named by the user (`dim_names`) or by flax's annotations keeps that name. Every other
class that has a word is named by it: bare where it is the only one with that word, or the
primary one (the role's class, the attention's own `heads`); the others with a qualifier in
parentheses, the shortest that tells them apart — the pattern's own (`head_dim(qk)`,
`head_dim(v)`), then the module of the first parameter it shards, or the scope of the op it
first appears in (`vocab(embed_tokens)`, `vocab(lm_head)`, `channels(block_group_3/conv_0)`),
then its size. A class that a slice, pad or concatenation cuts from a named class (or a data
input's dim that one is cut from) takes that class's word, qualified: `head_dim(rotary_emb)`,
`seq(input_ids)`. The remaining classes keep their path names (`_names.py`), told apart the
same way where two read alike; one found on a captured constant is named by the op that reads
it. No name carries a de-duplication suffix (`_1`).

The name a class had before (its path name) stays in `DimClass.formerly`, so plan files saved
with it still load.
"""

from __future__ import annotations

from collections import defaultdict

from ._names import input_parts, reader_label
from ._roles import find_roles
from ._words import Word
from ..program import NO_OP

# Ops that cut, shift or join a dim: a class made by one from a named class (the halves of a
# rotary embedding's head_dim), or a data input's dim cut into a named one (the tokens' dim
# that the shifted `seq` is cut from), is named after it.
_CUTS = frozenset({"slice", "dynamic_slice", "split", "pad", "concatenate", "rev"})
_LEAVES = frozenset({"kernel", "bias", "embedding", "embeddings", "weight", "scale", "w", "b",
                     "offset", "table", "value"})


def field_names(an, words, path_names: list[str], hinted: list[bool]) -> list[str]:
    """The name of each class of `an` (see the module docstring). words: {class id: Word}
    (completed here with the classes named by their neighbours);
    path_names: each class's name from its path (unique); hinted: whether a class is named by
    `dim_names` or an annotation (its path name is then that name)."""
    n = len(an.classes)
    taken = {path_names[c] for c in range(n) if hinted[c]}
    base = [path_names[c] if hinted[c] else (words[c].word if c in words else None)
            for c in range(n)]
    known = {c: base[c] for c in range(n) if base[c] is not None}
    for c in range(n):
        if base[c] is None:
            near = _neighbour(an, c, known)
            if near is not None:
                words[c] = Word(near)
                base[c] = near
    groups: dict[str, list[int]] = defaultdict(list)
    for c in range(n):
        if not hinted[c] and c in words:
            groups[base[c]].append(c)
    names = list(path_names)
    for c in range(n):
        if not hinted[c] and c not in words and "%" in names[c] and an.classes[c].members:
            names[c] = _constant_name(an, c)  # (a class of no whole dim keeps its path name)
    for word, members in groups.items():
        primary = [c for c in members if words[c].primary]
        bare = primary[0] if len(primary) == 1 and word not in taken else (
            members[0] if len(members) == 1 and word not in taken else None)
        rest = [c for c in members if c != bare]
        if bare is not None:
            names[bare] = word
        for c, q in zip(rest, _qualifiers(an, rest, [words[c].qualifier for c in rest],
                                                 path_names)):
            names[c] = f"{word}({q})"
    # the path names left: told apart where they read alike (two reshapes of one scope)
    used = defaultdict(list)
    for c in range(n):
        used[names[c]].append(c)
    for name, members in sorted(used.items()):
        if len(members) > 1:
            keep = [c for c in members if hinted[c] or (c in words and names[c] == base[c])]
            rest = [c for c in members if c not in keep]
            if not keep:
                keep, rest = rest[:1], rest[1:]
            for c, q in zip(rest, _qualifiers(an, rest, [""] * len(rest), path_names)):
                names[c] = f"{name}({q})"
    return names


def _qualifiers(an, classes: list[int], given: list[str], path_names) -> list[str]:
    """The shortest qualifiers that tell `classes` apart: the given ones; where those are
    alike, then where each sits (a suffix of its module or scope, as long as needed: a layer
    index comes with the part it indexes, `layers/1`), then its size, then its place in the
    analysis's order."""
    out = list(given)
    alike: dict[str, list[int]] = defaultdict(list)
    for i, q in enumerate(given):
        alike[q].append(i)
    for q, idx in alike.items():
        if len(idx) == 1 and q:
            continue
        places = {i: _place(an, classes[i], path_names) for i in idx}
        longest = max((len(p) for p in places.values()), default=0)
        k = {i: 1 for i in idx}
        tried = {i: _join(q, _suffix(places[i], 1)) for i in idx}
        for _ in range(longest):
            clash = _clashing(tried)
            if not clash:
                break
            for i in clash:
                k[i] += 1
                tried[i] = _join(q, _suffix(places[i], k[i]))
        for i in _clashing(tried):  # alike wherever they sit: by size, at their nearest
            tried[i] = _join(_join(q, _suffix(places[i], 1)), str(an.classes[classes[i]].size))
        for n, i in enumerate(sorted(_clashing(tried))):
            tried[i] = _join(tried[i], f"#{n + 1}")
        for i in idx:
            out[i] = tried[i]
    return out


def _clashing(tried: dict[int, str]) -> list[int]:
    """The keys whose value is empty or another key's too."""
    count: dict[str, int] = defaultdict(int)
    for t in tried.values():
        count[t] += 1
    return [i for i, t in tried.items() if not t or count[t] > 1]


def _suffix(parts: list[str], k: int) -> str:
    """The last `k` parts, and the name a leading index belongs to (`layers/1/self_attn`)."""
    start = max(len(parts) - k, 0)
    if start > 0 and parts[start].isdigit():
        start -= 1
    return "/".join(parts[start:])


def _apart(qualifiers: list[str]) -> bool:
    return all(qualifiers) and len(set(qualifiers)) == len(qualifiers)


def _join(a: str, b: str) -> str:
    return ",".join(p for p in (a, b) if p)


def _place(an, c: int, path_names) -> list[str]:
    """Where class `c` sits: the module of the first input it shards (`embed_tokens` for
    `params/model/embed_tokens/embedding`), else the user scope of the op that makes its first
    member, else the function its path name places it in (`pool` for `pool/pad[1]`)."""
    prog = an.program
    members = an.classes[c].members
    inputs = set(prog.inputs)
    state = find_roles(an).state_inputs  # a data input first: `channels(images)`
    for v, _ in sorted(members, key=lambda m: (m[0] in state, m[0])):
        if v in inputs:
            parts = input_parts(prog, v)
            module = [p for p in parts[:-1]] if parts[-1] in _LEAVES and len(parts) > 1 else parts
            return [p for p in module if p not in ("params", "~")] or parts
    for v, _ in members:
        producer = prog.values[v].producer
        if producer != NO_OP and prog.ops[producer].user_scope:
            return _without_methods(prog.ops[producer].user_scope.split("/"))
    return path_names[c].split("/")[:-1]


def _without_methods(parts: list[str]) -> list[str]:
    """A scope without the methods flax names after their module (`attn.setup`,
    `attn._split_heads` are `attn`'s)."""
    out: list[str] = []
    for p in parts:
        p = p.split(".")[0] if p.count(".") == 1 else p
        if not out or out[-1] != p:
            out.append(p)
    return out


def _neighbour(an, c: int, known: dict[int, str], limit: int = 32) -> str | None:
    """The name of a class that a cut makes class `c` from, or makes from it (see _CUTS)."""
    prog, vc = an.program, an.value_classes
    for v, d in an.classes[c].members[:limit]:
        producer = prog.values[v].producer
        ops = ([producer] if producer != NO_OP else []) + list(prog.users(v))
        for o in ops:
            op = prog.ops[o]
            if op.primitive not in _CUTS:
                continue
            for u in (*op.operands, *op.results):
                if u != v and prog.values[u].ndim == prog.values[v].ndim:
                    k = vc[u][d]
                    if k != c and k in known:
                        return known[k]
    return None


def _constant_name(an, c: int) -> str:
    """A class first found on a constant the step captured (a RoPE table), named by the op
    that reads the constant: `rotary_emb/table[0]`."""
    prog = an.program
    v, d = next(((v, d) for v, d in an.classes[c].members
                 if prog.values[v].producer == NO_OP), an.classes[c].members[0])
    label = reader_label(prog, v).split("/")
    return "/".join(label[-2:] if label != [""] else ["constant"]) + f"[{d}]"
