"""A hand-made view model for the kernel-less plan viewer's tests (test_plan_viewer.py).

`gpt_view()` is a view model (toast_lab/lab/_viewmodel.py) of a small GPT training step on a
2×2×2 mesh, written by hand rather than by the Lab's ViewBuilder: its ids (`op_104`,
`grp_block*/mlp`) are not the ViewBuilder's, and it carries none of the optional fields (note,
notice, sharded, ...), so the viewer is also tested on a view model without them. The Lab's own view model,
which the widget tests use, is tests/data/lab_view_gpt.json, written by make_view_fixture.py
with the real ViewBuilder.
"""

from __future__ import annotations


import graphviz


# Paul Tol's "bright" qualitative scheme: distinct for the common colour-vision deficiencies.
PALETTE = ["#4477AA", "#EE6677", "#228833", "#CCBB44", "#66CCEE", "#AA3377", "#BBBBBB"]
MESH = {"axes": {"data": 2, "seq": 2, "model": 2}, "device": "tpu-v5e", "memory_bytes": 16 * 2**30}
GIB = 2**30
MIB = 2**20

B, S, D, H, E, F, V, L = 8, 512, 768, 12, 64, 3072, 32000, 4
CLASSES = [  # name, size, bytes at stake, layers, axes under the current plan
    ("batch", B, 1.9 * GIB, 1, ["data"]),
    ("seq", S, 1.6 * GIB, 1, ["seq"]),
    ("embed", D, 0.7 * GIB, 1, []),
    ("heads", H, 0.5 * GIB, L, ["model"]),
    ("head_dim", E, 0.1 * GIB, L, []),
    ("mlp", F, 0.9 * GIB, L, ["model"]),
    ("vocab", V, 0.6 * GIB, 1, ["model"]),
]
CID = {name: i for i, (name, *_rest) in enumerate(CLASSES)}
STEP_S = 0.0412
PEAK_B = 11.3 * GIB


def _choices(name: str, size: int, axes: list[str], k: int) -> list[dict]:
    """Replicated and each axes set, with counterfactual prices around the current plan."""
    options = [[], ["data"], ["seq"], ["model"], ["data", "model"]]
    out = []
    for j, opt in enumerate(options):  # j: option index
        current = opt == axes
        reason = None
        n = 1
        for a in opt:
            n *= MESH["axes"][a]
        if size % n:
            reason = f"{name} has size {size}, not divisible by {'×'.join(opt)} = {n}"
        elif opt and name not in ("batch", "seq") and set(opt) & {"data", "seq"}:
            clash = sorted(set(opt) & {"data", "seq"})[0]
            reason = (f"axis {clash!r} already shards {'batch' if clash == 'data' else 'seq'} "
                      f"on the same values")
        elif name == "batch" and "model" in opt:
            reason = "axis 'model' already shards heads on the same values (q, k, v)"
        elif name == "batch" and "seq" in opt or name == "seq" and "data" in opt:
            reason = "a value would use one mesh axis twice"
        # Sharding a class divides its compute and memory and adds communication.
        n_cur = 1
        for a in axes:
            n_cur *= MESH["axes"][a]
        comm = 0.0 if opt == axes else 0.0009 * (1 + k % 3) * len(opt)
        step = None if reason else round(STEP_S * (0.75 + 0.25 * n_cur / n) + comm, 6)
        peak = None if reason else int(PEAK_B * (0.8 + 0.2 * n_cur / n) + (j != 0) * k * 17 * MIB)
        if current:
            step, peak = STEP_S, int(PEAK_B)
        out.append({"label": "replicated" if not opt else "×".join(opt), "value": opt,
                    "current": current, "valid": reason is None, "reason": reason,
                    "step_time_s": step, "peak_memory_bytes": peak})
    return out


def _classes() -> list[dict]:
    out = []
    for i, (name, size, nbytes, layers, axes) in enumerate(CLASSES):
        out.append({"id": i, "name": name, "size": size, "bytes": int(nbytes), "layers": layers,
                    "color": PALETTE[i % len(PALETTE)], "axes": axes, "pinned": name == "batch",
                    "choices": _choices(name, size, axes, i)})
    return out


def _conflicts() -> list[dict]:
    res = ["keep_q", "keep_k", "replicate"]
    prices = {"keep_q": (STEP_S, PEAK_B), "keep_k": (STEP_S * 1.094, PEAK_B * 0.97),
              "replicate": (STEP_S * 1.31, PEAK_B * 1.22)}
    seq = {"id": 0, "name": "seq@block*/attn/logits", "class_id": CID["seq"], "class_name": "seq",
           "where": "block*/attn/logits: dot_general bqhe,bkhe->bhqk (q and k both seq)",
           "source": "toast_lab/zoo/_gpt.py:61 (logits = jnp.einsum('bqhe,bkhe->bhqk', q, k))",
           "active": True, "resolution": "keep_q", "resolutions": res, "pinned": False,
           "choices": [{"label": r, "value": r, "current": r == "keep_q", "valid": True,
                        "reason": None, "step_time_s": round(prices[r][0], 6),
                        "peak_memory_bytes": int(prices[r][1])} for r in res]}
    gram = {"id": 1, "name": "embed@loss/z_reg", "class_id": CID["embed"], "class_name": "embed",
            "where": "loss/z_reg: dot_general bd,cd->bc (both dims embed)",
            "source": "toast_lab/zoo/_gpt.py:88", "active": False, "resolution": "keep_dim0",
            "resolutions": ["keep_dim0", "keep_dim1", "replicate"], "pinned": False,
            "choices": []}
    return [seq, gram]


class _Graph:
    """Collects nodes and edges for the view model while writing the DOT."""

    def __init__(self, name: str):
        self.dot = graphviz.Digraph(name, graph_attr={
            "rankdir": "TB", "nodesep": "0.3", "ranksep": "0.32", "fontname": "Helvetica",
            "fontsize": "11", "bgcolor": "transparent", "pad": "0.2"},
            node_attr={"shape": "box", "style": "rounded,filled", "fillcolor": "white",
                       "color": "#5b6570", "fontname": "Helvetica", "fontsize": "11",
                       "height": "0.32", "margin": "0.1,0.04"},
            edge_attr={"color": "#8a939c", "arrowsize": "0.6", "fontname": "Helvetica",
                       "fontsize": "9.5"})
        self.nodes: list[dict] = []
        self.edges: list[dict] = []

    def node(self, g, nid, kind, label, classes=(), conflicts=(), group=None, op=None,
             compute=0.0, comm=0.0, collectives=(), **attrs):
        cls = " ".join(f"cls-{c}" for c in classes)
        if kind == "group":
            attrs = {"style": "rounded,filled,bold", "fillcolor": "#e9eef5", **attrs}
        elif kind in ("input", "output"):
            attrs = {"shape": "box", "style": "filled", "fillcolor": "#f4f4f4", **attrs}
        if conflicts:
            attrs = {"shape": "octagon", "color": "#b3261e", "peripheries": "2",
                     "penwidth": "1.4", "style": "filled", "fillcolor": "#fff4f3", **attrs}
        elif classes and kind == "op":
            attrs = {"color": PALETTE[classes[0]], "penwidth": "1.6", **attrs}
        g.node(nid, label=label, id=nid, **({"class": cls} if cls else {}), **attrs)
        self.nodes.append({"id": nid, "kind": kind, "group": group, "label": label, "op": op,
                           "classes": list(classes), "conflicts": list(conflicts),
                           "compute_s": compute, "comm_s": comm, "collectives": list(collectives)})

    def edge(self, g, a, b, shape, classes=(), badge=None):
        eid = f"{a}->{b}"
        attrs = {"id": eid, "tooltip": shape}
        if classes:
            attrs["class"] = " ".join(f"cls-{c}" for c in classes)
            attrs["color"] = PALETTE[classes[-1]]
            attrs["penwidth"] = "1.5"
        if badge:
            attrs.update(label=f" {badge} ", fontcolor="#8a4b00", style="dashed")
        g.edge(a, b, **attrs)
        self.edges.append({"id": eid, "source": a, "target": b, "classes": list(classes),
                           "label": shape, "badge": badge})


def _groups(expanded: set[str]) -> list[dict]:
    c = CID
    spec = [  # id, label, parent, repeat, ops, compute, comm, classes, conflicts
        ("", "gpt_train_step", None, 1, 412, 0.0338, 0.0074, list(range(7)), [0, 1]),
        ("embed", "embed", "", 1, 9, 0.0011, 0.0002, [c["batch"], c["seq"], c["embed"], c["vocab"]], []),
        ("block*", "block", "", L, 86, 0.0066, 0.0014, [0, 1, 2, 3, 4, 5], [0]),
        ("block*/ln1", "ln1", "block*", 1, 7, 0.0002, 0.0, [0, 1, 2], []),
        ("block*/attn", "attn", "block*", 1, 31, 0.0031, 0.0009, [0, 1, 2, 3, 4], [0]),
        ("block*/attn/softmax", "softmax", "block*/attn", 1, 6, 0.0004, 0.0, [0, 1, 3], [0]),
        ("block*/ln2", "ln2", "block*", 1, 7, 0.0002, 0.0, [0, 1, 2], []),
        ("block*/mlp", "mlp", "block*", 1, 14, 0.0027, 0.0005, [0, 1, 2, 5], []),
        ("ln_f", "ln_f", "", 1, 7, 0.0002, 0.0, [0, 1, 2], []),
        ("lm_head", "lm_head", "", 1, 5, 0.0019, 0.0004, [0, 1, 2, 6], []),
        ("loss", "loss", "", 1, 18, 0.0005, 0.0001, [0, 1, 6], [1]),
        ("optimizer", "adamw", "", 1, 46, 0.0010, 0.0010, [2, 3, 4, 5, 6], []),
    ]
    out = [{"id": i, "label": lab, "parent": p, "children": [], "repeat": r, "ops": n,
            "compute_s": cs, "comm_s": cm, "classes": cl, "conflicts": cf,
            "expanded": i == "" or i in expanded} for i, lab, p, r, n, cs, cm, cl, cf in spec]
    by = {g["id"]: g for g in out}
    for g in out:
        if g["parent"] is not None:
            by[g["parent"]]["children"].append(g["id"])
    return out


def _group_node(gr, g, groups, gid, classes=()):
    x = groups[gid]
    rep = f" ×{x['repeat']}" if x["repeat"] > 1 else ""
    label = f"{x['label']}{rep}\n{x['ops']} ops · {x['compute_s'] * 1e3:.2f} ms"
    gr.node(g, f"grp_{gid}", "group", label, classes=classes or x["classes"][:3], group=gid,
            compute=x["compute_s"], comm=x["comm_s"])


def gpt_graph(expanded: set[str]) -> tuple[str, list[dict], list[dict], list[dict]]:
    """The visible graph with `expanded` groups open (block* and block*/attn by default)."""
    groups = {g["id"]: g for g in _groups(expanded)}
    c = CID
    gr = _Graph("gpt_train_step")
    d = gr.dot
    bsd = [c["batch"], c["seq"], c["embed"]]
    gr.node(d, "in_tokens", "input", "tokens\ni32[8,512]", classes=[c["batch"], c["seq"]])
    gr.node(d, "in_params", "input", "params\n124 M f32", classes=[c["embed"], c["vocab"], c["mlp"]])
    _group_node(gr, d, groups, "embed")
    gr.edge(d, "in_tokens", "grp_embed", "i32[8,512]", [c["batch"], c["seq"]])
    gr.edge(d, "in_params", "grp_embed", "f32[32000,768]", [c["vocab"], c["embed"]])
    last = "grp_embed"
    if "block*" in expanded:
        with d.subgraph(name="cluster_block", graph_attr={
                "label": f"block ×{L}  (one set of decisions for all {L} layers)", "id": "cluster:block*",
                "style": "rounded,dashed", "color": "#7d8791", "fontcolor": "#3b4249",
                "labeljust": "l", "margin": "12"}) as blk:
            _group_node(gr, blk, groups, "block*/ln1")
            gr.edge(d, last, "grp_block*/ln1", "f32[8,512,768]", bsd)
            if "block*/attn" in expanded:
                with blk.subgraph(name="cluster_attn", graph_attr={
                        "label": "attn", "id": "cluster:block*/attn", "style": "rounded",
                        "color": "#a7b0b9", "labeljust": "l"}) as at:
                    ops = [
                        (101, "q_proj", "dot_general", "f32[8,512,12,64]", 0.00041, 0.0),
                        (102, "k_proj", "dot_general", "f32[8,512,12,64]", 0.00041, 0.0),
                        (103, "v_proj", "dot_general", "f32[8,512,12,64]", 0.00041, 0.0),
                    ]
                    for op, name, prim, shape, cs, cm in ops:
                        gr.node(at, f"op_{op}", "op", f"{name}\n{prim} {shape}",
                                classes=[c["batch"], c["seq"], c["heads"]], op=op, compute=cs, comm=cm)
                        gr.edge(d, "grp_block*/ln1", f"op_{op}", "f32[8,512,768]", bsd)
                    gr.node(at, "op_104", "op", "logits\ndot_general f32[8,12,512,512]\n⚠ seq: keep_q",
                            classes=[c["batch"], c["heads"], c["seq"]], conflicts=[0], op=104,
                            compute=0.00052, comm=0.00031, collectives=["all-gather seq (k)"])
                    gr.edge(d, "op_101", "op_104", "f32[8,512,12,64]", [c["batch"], c["seq"], c["heads"]])
                    gr.edge(d, "op_102", "op_104", "f32[8,512,12,64]", [c["batch"], c["heads"]],
                            badge="all-gather seq")
                    _group_node(gr, at, groups, "block*/attn/softmax", classes=[c["batch"], c["heads"], c["seq"]])
                    gr.edge(d, "op_104", "grp_block*/attn/softmax", "f32[8,12,512,512]",
                            [c["batch"], c["heads"], c["seq"]])
                    gr.node(at, "op_111", "op", "attn_v\ndot_general f32[8,512,12,64]",
                            classes=[c["batch"], c["seq"], c["heads"]], op=111, compute=0.00052,
                            comm=0.00017, collectives=["all-gather seq (v)"])
                    gr.edge(d, "grp_block*/attn/softmax", "op_111", "f32[8,12,512,512]",
                            [c["batch"], c["heads"], c["seq"]])
                    gr.edge(d, "op_103", "op_111", "f32[8,512,12,64]", [c["batch"], c["heads"]],
                            badge="all-gather seq")
                    gr.node(at, "op_112", "op", "o_proj\ndot_general f32[8,512,768]",
                            classes=[c["batch"], c["seq"], c["embed"]], op=112, compute=0.00041,
                            comm=0.00038, collectives=["all-reduce model"])
                    gr.edge(d, "op_111", "op_112", "f32[8,512,12,64]", [c["batch"], c["seq"], c["heads"]])
                attn_out = "op_112"
            else:
                _group_node(gr, blk, groups, "block*/attn")
                gr.edge(d, "grp_block*/ln1", "grp_block*/attn", "f32[8,512,768]", bsd)
                attn_out = "grp_block*/attn"
            gr.node(blk, "op_113", "op", "residual\nadd f32[8,512,768]", classes=bsd, op=113,
                    compute=0.00002)
            gr.edge(d, attn_out, "op_113", "f32[8,512,768]", bsd, badge="all-reduce model")
            gr.edge(d, last, "op_113", "f32[8,512,768]", bsd)
            _group_node(gr, blk, groups, "block*/ln2")
            gr.edge(d, "op_113", "grp_block*/ln2", "f32[8,512,768]", bsd)
            if "block*/mlp" in expanded:
                with blk.subgraph(name="cluster_mlp", graph_attr={
                        "label": "mlp", "id": "cluster:block*/mlp", "style": "rounded",
                        "color": "#a7b0b9", "labeljust": "l"}) as mp:
                    gr.node(mp, "op_121", "op", "fc_in\ndot_general f32[8,512,3072]",
                            classes=[c["batch"], c["seq"], c["mlp"]], op=121, compute=0.00124)
                    gr.node(mp, "op_122", "op", "gelu\nf32[8,512,3072]",
                            classes=[c["batch"], c["seq"], c["mlp"]], op=122, compute=0.00006)
                    gr.node(mp, "op_123", "op", "fc_out\ndot_general f32[8,512,768]",
                            classes=[c["batch"], c["seq"], c["embed"]], op=123, compute=0.00124,
                            comm=0.00038, collectives=["all-reduce model"])
                    gr.edge(d, "grp_block*/ln2", "op_121", "f32[8,512,768]", bsd)
                    gr.edge(d, "op_121", "op_122", "f32[8,512,3072]", [c["batch"], c["seq"], c["mlp"]])
                    gr.edge(d, "op_122", "op_123", "f32[8,512,3072]", [c["batch"], c["seq"], c["mlp"]])
                mlp_out = "op_123"
            else:
                _group_node(gr, blk, groups, "block*/mlp")
                gr.edge(d, "grp_block*/ln2", "grp_block*/mlp", "f32[8,512,768]", bsd)
                mlp_out = "grp_block*/mlp"
            gr.node(blk, "op_124", "op", "residual\nadd f32[8,512,768]", classes=bsd, op=124,
                    compute=0.00002)
            gr.edge(d, mlp_out, "op_124", "f32[8,512,768]", bsd, badge="all-reduce model")
            gr.edge(d, "op_113", "op_124", "f32[8,512,768]", bsd)
        last = "op_124"
    else:
        _group_node(gr, d, groups, "block*")
        gr.edge(d, last, "grp_block*", "f32[8,512,768]", bsd)
        last = "grp_block*"
    for gid in ("ln_f", "lm_head", "loss"):
        _group_node(gr, d, groups, gid)
        shape = "f32[8,512,32000]" if gid == "loss" else "f32[8,512,768]"
        gr.edge(d, last, f"grp_{gid}", shape, [c["batch"], c["seq"]] + ([c["vocab"]] if gid == "loss" else [c["embed"]]))
        last = f"grp_{gid}"
    gr.edge(d, "in_params", "grp_lm_head", "f32[768,32000]", [c["embed"], c["vocab"]])
    _group_node(gr, d, groups, "optimizer")
    gr.edge(d, "grp_loss", "grp_optimizer", "grads 124 M f32", [c["embed"], c["mlp"], c["vocab"]],
            badge="all-reduce data")
    gr.node(d, "out_params", "output", "new params, opt state", classes=[c["embed"], c["mlp"], c["vocab"]])
    gr.node(d, "out_loss", "output", "loss f32[]")
    gr.edge(d, "grp_optimizer", "out_params", "124 M f32 ×3", [c["embed"], c["mlp"], c["vocab"]])
    gr.edge(d, "grp_loss", "out_loss", "f32[]")
    return d.source, gr.nodes, gr.edges, list(groups.values())


def _estimate(step=STEP_S, peak=PEAK_B) -> dict:
    breakdown = {"parameters": 0.5 * GIB, "optimizer state": 1.0 * GIB, "gradients": 0.5 * GIB,
                 "activations": 8.4 * GIB, "temporaries": 0.9 * GIB}
    return {"step_time_s": step, "compute_s": 0.0338, "communication_s": 0.0093,
            "exposed_communication_s": step - 0.0338,
            "communication_by_axis": {"data": 0.0031, "seq": 0.0024, "model": 0.0038},
            "peak_memory_bytes": int(peak), "memory_capacity_bytes": MESH["memory_bytes"],
            "feasible": peak <= MESH["memory_bytes"],
            "memory_breakdown": {k: int(v) for k, v in breakdown.items()},
            "collectives": 54}


def _snippet() -> str:
    return '''import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((2, 2, 2), ("data", "seq", "model"))
rules = {"batch": ("data",), "seq": ("seq",), "heads": ("model",),
         "mlp": ("model",), "vocab": ("model",), "embed": None, "head_dim": None}
in_shardings = (
    {"wte": NamedSharding(mesh, P("model", None)),
     "blocks": {"wq": NamedSharding(mesh, P(None, None, "model", None)),
                "w_in": NamedSharding(mesh, P(None, None, "model"))}},
    NamedSharding(mesh, P("data", "seq")),
)
step = jax.jit(train_step, in_shardings=in_shardings, donate_argnums=(0,))
'''


def _details() -> dict:
    return {"op": 104, "primitive": "dot_general", "source": "toast_lab/zoo/_gpt.py:61",
            "scope": "block*/attn", "compute_s": 0.00052, "comm_s": 0.00031,
            "collectives": ["all-gather seq (k, before the logits)"],
            "operands": [
                {"value": 2211, "shape": [8, 512, 12, 64], "dtype": "f32",
                 "classes": ["batch", "seq", "heads", "head_dim"], "spec": "P('data', 'seq', 'model', None)"},
                {"value": 2212, "shape": [8, 512, 12, 64], "dtype": "f32",
                 "classes": ["batch", "seq", "heads", "head_dim"], "spec": "P('data', None, 'model', None)"}],
            "results": [
                {"value": 2213, "shape": [8, 12, 512, 512], "dtype": "f32",
                 "classes": ["batch", "heads", "seq", "seq"], "spec": "P('data', 'model', 'seq', None)"}]}


def gpt_view(expanded: frozenset[str] = frozenset({"block*", "block*/attn"})) -> dict:
    dot, nodes, edges, groups = gpt_graph(set(expanded))
    experts = [
        ("dp", 0.0521, 14.9 * GIB, True, {"batch": ["data", "seq", "model"]}),
        ("fsdp", 0.0468, 6.2 * GIB, True, {"batch": ["data", "seq", "model"], "embed": ["data", "seq", "model"]}),
        ("megatron", 0.0603, 9.7 * GIB, True, {"heads": ["data", "seq", "model"], "mlp": ["data", "seq", "model"]}),
        ("dp+megatron", 0.0437, 12.1 * GIB, True, {"batch": ["data", "seq"], "heads": ["model"], "mlp": ["model"]}),
        ("sequence parallel", 0.0449, 10.6 * GIB, True, {"batch": ["data"], "seq": ["seq", "model"]}),
        ("replicated", 0.1650, 21.4 * GIB, False, {}),
    ]
    history = [[0.1 * i, 180 * i, max(STEP_S, 0.0521 - 0.0011 * i), int(PEAK_B * (1 + 0.01 * (20 - i)))]
               for i in range(1, 21)]
    return {
        "format": "toast-lab-view", "version": 1,
        "program": {"name": "gpt_train_step", "ops": 412, "fingerprint": "9c1f27a4e0b3d5c8"},
        "mesh": MESH,
        "classes": _classes(),
        "conflicts": _conflicts(),
        "groups": groups,
        "graph": {"dot": dot, "nodes": nodes, "edges": edges},
        "estimate": _estimate(),
        "experts": [{"name": n, "step_time_s": s, "peak_memory_bytes": int(m), "feasible": f,
                     "classes": c} for n, s, m, f, c in experts],
        "search": {"running": False, "simulations": 3600, "elapsed_s": 2.0, "sims_per_s": 1800.0,
                   "best_step_time_s": STEP_S, "history": history},
        "snippet": _snippet(),
        "error": None,
        "selected": None,
        "details": None,
        "pinned": ["batch"],
    }


def plan_file(view: dict) -> dict:
    """A plan file (format v2) that carries its view model, as lab.export writes it."""
    return {"format": "toast-lab-plan", "version": 2,
            "program": {"name": view["program"]["name"], "fingerprint": view["program"]["fingerprint"],
                        "classes": len(view["classes"]), "conflicts": len(view["conflicts"])},
            "mesh": {"axes": view["mesh"]["axes"], "device": view["mesh"]["device"]},
            "classes": {c["name"]: c["axes"] for c in view["classes"]},
            "conflicts": {c["name"]: c["resolution"] for c in view["conflicts"]},
            "pinned": view["pinned"], "estimate": view["estimate"], "view": view}
