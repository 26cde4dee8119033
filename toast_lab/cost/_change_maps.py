"""What an edit of a plan can reach: fixed maps from the plan's split classes and conflicts to the
value types whose masks read them, and from those to the groups, operand rows, operands and op
types that read a type's masks (ChangeMaps, _tables.py).

They are built once per model from the type tables. An incremental evaluation
(_kernel/_dirty.py) follows them from what its edit changed, and visits those and nothing else;
each map lists, per source, every target whose cost reads the source (a superset is safe, a
missing target is a stale cost).
"""

from __future__ import annotations

import numpy as np

from ._operand_rows import ROW_FROM_WHOLE, ROW_GROUP, ROW_RESULT
from ._tables import ChangeMaps, Fanout, TypeTables

_I = np.int64


def change_maps(tables: TypeTables) -> ChangeMaps:
    """The ChangeMaps of a model's type tables (any shared reads and fixed charges: they read
    none of what the maps say)."""
    vc, tags = tables.value_classes, tables.value_tags
    T, S, C = len(vc), len(tables.split_base), len(tables.conflict_class)
    G, R = len(tables.groups), len(tables.rows)
    class_types, conflict_types = _lists(S), _lists(C)
    for t in range(T):
        for d in range(vc.shape[1]):
            if vc[t, d] >= 0:
                class_types[vc[t, d]].append(t)
            if tags[t, d] >= 0:  # its resolution, and whether its class is sharded at all
                k = tables.tag_conflict[tags[t, d]]
                conflict_types[k].append(t)
                class_types[tables.conflict_class[k]].append(t)
    type_groups = _lists(T)
    for g, group in enumerate(tables.groups):
        for m in tables.group_members[group["start"]:group["end"]]:
            type_groups[m["value_type"]].append(g)
    type_rows, group_rows = _lists(T), _lists(G)
    for r, row in enumerate(tables.rows):
        type_rows[row["value_type"]].append(r)
        if row["kind"] in (ROW_RESULT, ROW_FROM_WHOLE):
            type_rows[row["source_type"]].append(r)
        elif row["kind"] == ROW_GROUP:
            group_rows[row["group"]].append(r)
    # an operand is recosted where its type or one of its rows is: reached from a type
    # through its rows too, and from a group through its rows
    row_operands = _lists(R)
    type_operands = _lists(T)
    for o, operand in enumerate(tables.operands):
        type_operands[operand["value_type"]].append(o)
        for r in tables.operand_rows[operand["start"]:operand["end"]]:
            row_operands[r].append(o)
    for t in range(T):
        type_operands[t] += [o for r in type_rows[t] for o in row_operands[r]]
    group_operands = [[o for r in rows for o in row_operands[r]] for rows in group_rows]
    type_ops, group_ops = _op_lists(tables, T, G)
    operand_ops = _lists(len(tables.operands))
    for p, op in enumerate(tables.ops):
        for m in tables.op_operands[op["operands_start"]:op["operands_end"]]:
            operand_ops[m["operand_type"]].append(p)
    for t in range(T):  # (and an op type is recosted where one of its operands is)
        type_ops[t] += [p for o in type_operands[t] for p in operand_ops[o]]
    for g in range(G):
        group_ops[g] += [p for o in group_operands[g] for p in operand_ops[o]]
    followers = _lists(len(tables.ops))
    for p, lead in enumerate(tables.ops["sum_leader"]):
        if lead >= 0:
            followers[lead].append(p)
    return ChangeMaps(class_types=_fanout(class_types), conflict_types=_fanout(conflict_types),
                      type_groups=_fanout(type_groups), type_rows=_fanout(type_rows),
                      group_rows=_fanout(group_rows), type_operands=_fanout(type_operands),
                      group_operands=_fanout(group_operands), type_ops=_fanout(type_ops),
                      group_ops=_fanout(group_ops), sum_followers=_fanout(followers),
                      # an explicitly batched gather or scatter: recosted at every edit (they
                      # re-tile their indices once between them, in order)
                      batched=np.nonzero(tables.ops["batch_index_dims"] != 0)[0].astype(_I))


def _op_lists(tables: TypeTables, T: int, G: int) -> tuple[list, list]:
    """Per value type the op types whose result axes or costs read its masks, per group those
    reducing over it (the partial-sum axes)."""
    type_ops, group_ops = _lists(T), _lists(G)
    depends = tables.op_depends
    for p, op in enumerate(tables.ops):
        for t in tables.op_depends_on[depends[p]["start"]:depends[p]["end"]]:
            type_ops[t].append(p)
        if op["result_type"] >= 0:
            type_ops[op["result_type"]].append(p)
        for g in tables.op_groups[op["groups_start"]:op["groups_end"]]:
            group_ops[g].append(p)
    return type_ops, group_ops


def _lists(n: int) -> list[list[int]]:
    return [[] for _ in range(n)]


def _fanout(lists: list[list[int]]) -> Fanout:
    """The Fanout of per-source target lists, each target once, in increasing order."""
    lists = [sorted(set(int(x) for x in lst)) for lst in lists]
    start = np.zeros(len(lists) + 1, _I)
    start[1:] = np.cumsum([len(lst) for lst in lists])
    return Fanout(start, np.array([x for lst in lists for x in lst], _I))
