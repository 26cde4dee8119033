"""trace(fn, *args) -> Program: a jaxpr walk in the manner of `jax.core.eval_jaxpr`.

Call-like primitives (nested `jit`, `custom_jvp_call`, `custom_vjp_call`, `remat`) are inlined
with their name scope kept; `scan`, `while` and `cond` stay regions whose bodies are walked once
(DESIGN.md §1).
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable

import jax
import numpy as np
from jax.extend import core as jex_core

from ._annotations import annotated_names
from ._program import (BODY_INPUT, CONST, INLINED_PRIMITIVES, INPUT, LITERAL, NO_OP, RESULT, Op,
                       Program, Value)

_SUBJAXPR_KEYS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


def trace(fn: Callable, *args, dim_names=None, **kwargs) -> Program:
    """Traces `fn(*args, **kwargs)` into a Program without running it.

    args: arrays or `jax.ShapeDtypeStruct` pytrees. dim_names: optional logical names for the
    dims of each positional argument (a tuple with one entry per argument: None, or a pytree of
    the argument's structure whose leaves are tuples of str|None, one per dim); defaults to
    `fn.dim_names` when the function carries one (the zoo's functions do). Class names come
    from these hints first, then from the logical axis names flax keeps on parameters
    (`nnx.with_partitioning`, linen's `nn.Partitioned`; see _annotations.py), then from
    argument paths.
    """
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args, **kwargs)
    closed = _dead_code_eliminated(_scan_xs_forwarded(closed))
    leaves_with_path, in_tree = jax.tree_util.tree_flatten_with_path((args, kwargs))
    input_names = [_path_name(path, _arg_names(fn, len(args))) for path, _ in leaves_with_path]
    if dim_names is None:
        dim_names = getattr(fn, "dim_names", None)
    hints = _flatten_dim_names(dim_names, args, kwargs)
    builder = _ProgramBuilder()
    inputs = [builder.new_value(v.aval, INPUT, name=input_names[i])
              for i, v in enumerate(closed.jaxpr.invars)]
    env: dict[Any, int] = dict(zip(closed.jaxpr.invars, inputs))
    for var, const in zip(closed.jaxpr.constvars, closed.consts):
        env[var] = builder.new_value(var.aval, CONST)
        builder.constants[env[var]] = const
    builder.walk(closed.jaxpr, env, scope="", region=NO_OP, trip=1, user_scope="", raw="")
    outputs = [builder.read(env, v) for v in closed.jaxpr.outvars]
    out_tree = jax.tree_util.tree_structure(out_shape)
    return Program(builder.values, builder.ops, inputs, outputs, in_tree, out_tree,
                   input_names, hints, getattr(fn, "__name__", type(fn).__name__),
                   constants=builder.constants, fn=fn, elided=builder.elided,
                   annotated_names=annotated_names((args, kwargs)))


def _shapes(outvars) -> str:
    return ",".join(str(tuple(int(d) for d in getattr(v.aval, "shape", ()))) for v in outvars)


class _ProgramBuilder:
    def __init__(self):
        self.values: list[Value] = []
        self.ops: list[Op | None] = []
        self.constants: dict[int, Any] = {}  # literal and captured-constant values
        # Ops inlined from a `remat` with prevent_cse get their own group: XLA may not share
        # work (an all-gather, say) between them and the rest (JAX puts a barrier around them).
        self.cse_group = 0
        self._groups = 0
        self._library: dict[int, bool] = {}  # id(jaxpr) -> whether a library helper's body
        # (position in ops, primitive, result shapes) of the equations traced as no op
        # (stop_gradient): a program's fingerprint still counts them (Program.fingerprint)
        self.elided: list[tuple[int, str, str]] = []

    def new_value(self, aval, origin: str, producer: int = NO_OP, name: str = "") -> int:
        vid = len(self.values)
        shape = tuple(int(d) for d in getattr(aval, "shape", ()))
        self.values.append(Value(vid, shape, aval.dtype, origin, producer, name))
        return vid

    def read(self, env, var) -> int:
        if isinstance(var, jex_core.Literal):
            vid = self.new_value(var.aval, LITERAL)
            # A literal's value may be a Python scalar; its aval says the dtype it has here.
            self.constants[vid] = np.asarray(var.val, dtype=var.aval.dtype)
            return vid
        return env[var]

    def walk(self, jaxpr, env, scope: str, region: int, trip: int, user_scope: str,
             call_site=None, raw: str = "") -> None:
        """call_site: inside the body of a library helper (jnp.einsum, jax.nn.gelu), the source
        info of the user's call to it; None in the user's own code. raw: the name stack, as
        JAX recorded it, of the call or region whose body this is."""
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            eqn_raw = _nest(raw, str(eqn.source_info.name_stack))
            stack = clean_scope(str(eqn.source_info.name_stack))
            eqn_scope = _nest(scope, stack)
            # A library's own named scopes are not the user's; jnp.einsum names its scope by
            # its spec ('bsd,dhk->bshk') without a call of its own.
            eqn_user = user_scope if call_site is not None else _nest(
                user_scope, "/".join(c for c in stack.split("/") if "->" not in c))
            source = call_site if call_site is not None else eqn.source_info
            operands = [self.read(env, v) for v in eqn.invars]
            where = (eqn_scope, eqn_user, call_site, eqn_raw)
            if name in INLINED_PRIMITIVES:
                self._inline(eqn, operands, env, where, region, trip)
            elif name == "stop_gradient":
                # An identity that JAX lowers to nothing: its result is its operand's buffer,
                # so a value read both through it and directly is one value (gathered once;
                # a KV cache written with stop_gradient(k) and read with k, measured).
                env.update(zip(eqn.outvars, operands))
                self.elided.append((len(self.ops), name, _shapes(eqn.outvars)))
            elif name == "scan":
                self._region(eqn, operands, env, where, region, trip,
                             [eqn.params["jaxpr"]], trip * int(eqn.params["length"]))
            elif name == "while":
                # The trip count of a while loop is unknown statically: its body counts once.
                self._region(eqn, operands, env, where, region, trip,
                             [eqn.params["cond_jaxpr"], eqn.params["body_jaxpr"]], trip,
                             outputs_of=(1,))
            elif name == "cond":
                self._region(eqn, operands, env, where, region, trip,
                             list(eqn.params["branches"]), trip)
            else:
                op_id = len(self.ops)
                results = [self.new_value(v.aval, RESULT, op_id) for v in eqn.outvars]
                self.ops.append(Op(op_id, name, eqn.params, tuple(operands), tuple(results),
                                   eqn_scope, source, region, trip,
                                   jax_primitive=eqn.primitive,
                                   cse_group=self.cse_group, user_scope=eqn_user,
                                   name_stack=eqn_raw))
                env.update(zip(eqn.outvars, results))

    def _inline(self, eqn, operands, env, where, region, trip):
        scope, user_scope, call_site, raw = where
        if eqn.primitive.name == "custom_linear_solve":
            sub, operands = _linear_solve_call(eqn, operands)
        else:
            sub = next(eqn.params[k] for k in _SUBJAXPR_KEYS if k in eqn.params)
        jaxpr, consts = (sub.jaxpr, sub.consts) if hasattr(sub, "consts") else (sub, ())
        call = eqn.params.get("name", "") if eqn.primitive.name in ("jit", "pjit") else ""
        inner_scope = _join(scope, call)
        if call_site is None and self._library_body(jaxpr):
            call_site = eqn.source_info  # the user called a library helper here
        inner_user = user_scope if call_site is not None else _join(user_scope, call)
        inner = dict(zip(jaxpr.invars, operands))
        for var, const in zip(jaxpr.constvars, consts):
            inner[var] = self.new_value(var.aval, CONST)
            self.constants[inner[var]] = const
        outer_group = self.cse_group
        if eqn.primitive.name in ("remat", "remat2", "checkpoint") and eqn.params.get(
                "prevent_cse", True):
            self._groups += 1
            self.cse_group = self._groups
        self.walk(jaxpr, inner, inner_scope, region, trip, inner_user, call_site, raw)
        self.cse_group = outer_group
        env.update((o, self.read(inner, v)) for o, v in zip(eqn.outvars, jaxpr.outvars))

    def _library_body(self, jaxpr) -> bool:
        """Whether an inlined call is a library helper's (jnp.einsum, jax.nn.gelu, a
        jax.random sampler): no equation in it was written by the user. JAX's traceback
        filter decides what is the user's (jax's own files are not); without tracebacks,
        assume the user's. Once per jaxpr: a helper called in every layer shares one."""
        from jax._src import source_info_util  # private, but the only way to JAX's user frame

        known = self._library.get(id(jaxpr))
        if known is None:
            tracebacks = [e.source_info.traceback for e in jaxpr.eqns]
            known = bool(tracebacks) and all(tb is not None for tb in tracebacks) and not any(
                next(source_info_util.user_frames(tb), None) is not None for tb in tracebacks)
            self._library[id(jaxpr)] = known
        return known

    def _region(self, eqn, operands, env, where, region, trip, bodies, body_trip,
                outputs_of=None):
        """Lays out a region op, then its bodies; `body` lists each body's inputs and outputs.

        outputs_of: which bodies' outputs enter the boundary (a while loop's cond output is
        its predicate, not a carried value); default all.
        """
        scope, user_scope, call_site, raw = where
        source = call_site if call_site is not None else eqn.source_info
        op_id = len(self.ops)
        self.ops.append(None)  # reserved: the region op precedes its body ops
        boundary_in, boundary_out, ranges = [], [], []
        for k, closed in enumerate(bodies):
            jaxpr = closed.jaxpr
            first = len(self.ops)
            inner = {v: self.new_value(v.aval, BODY_INPUT, op_id) for v in jaxpr.invars}
            for var, const in zip(jaxpr.constvars, closed.consts):
                inner[var] = self.new_value(var.aval, CONST)
                self.constants[inner[var]] = const
            self.walk(jaxpr, inner, scope, op_id, body_trip, user_scope, call_site, raw)
            ranges.append((first, len(self.ops)))
            ins = [inner[v] for v in jaxpr.invars]
            outs = [self.read(inner, v) for v in jaxpr.outvars]
            if eqn.primitive.name == "cond":  # per branch: inputs then outputs
                boundary_in += ins + outs
            else:
                boundary_in += ins
                if outputs_of is None or k in outputs_of:
                    boundary_out += outs
        results = [self.new_value(v.aval, RESULT, op_id) for v in eqn.outvars]
        self.ops[op_id] = Op(op_id, eqn.primitive.name, region_params(eqn), tuple(operands),
                             tuple(results), scope, source, region, trip,
                             body=tuple(boundary_in + boundary_out),
                             body_ops=(op_id + 1, len(self.ops)), body_ranges=tuple(ranges),
                             jax_primitive=eqn.primitive, user_scope=user_scope,
                             name_stack=raw)
        env.update(zip(eqn.outvars, results))


def _linear_solve_call(eqn, operands):
    """custom_linear_solve's operands are the consts of its four jaxprs (matvec, vecmat, solve,
    transpose_solve, in that order, `const_lengths` of each) then `b`; what runs is `solve`
    on its own consts and `b` (jax/_src/lax/control_flow/solves.py, _custom_linear_solve_impl,
    which is also its lowering). Its JVP and transpose are custom_linear_solves again, whose
    `solve` is the one that runs there."""
    lengths = list(eqn.params["const_lengths"])
    start = sum(lengths[:2])
    b = operands[sum(lengths):]
    return eqn.params["jaxprs"].solve, operands[start:start + lengths[2]] + b


# JAX wraps scopes in the transformations applied to them: "transpose(jvp(block0))/attn".
_TRANSFORM_WRAPPER = re.compile(r"\b(?:jvp|transpose|vmap|remat|checkpoint|pjit|jit)\(([^()]*)\)")


_RECOMPUTED = "rematted_computation"  # jax.checkpoint's name for the ops it recomputes


def clean_scope(name_stack: str) -> str:
    """'transpose(jvp(block0))/attn' -> 'block0/attn': the user's scopes, forward and backward
    alike."""
    prev = None
    while prev != name_stack:
        prev, name_stack = name_stack, _TRANSFORM_WRAPPER.sub(r"\1", name_stack)
    parts: list[str] = []
    for p in name_stack.split("/"):
        # Backward passes repeat the forward scope: "outer/transpose(jvp(outer))" -> "outer";
        # jax.checkpoint's recomputation of forward ops is theirs too, not a scope.
        if p and p != _RECOMPUTED and (not parts or parts[-1] != p):
            parts.append(p)
    return "/".join(parts)


def _scan_xs_forwarded(closed):
    """The jaxpr with each scan output that is one of the scan's xs passed through unchanged
    (ys[i] = xs[i] in every iteration) read from that xs instead; `_dead_code_eliminated`
    then drops the output. Inside `jit` calls too.

    flax.nnx's `nnx.scan` returns the stacked layers' state as ys, and under `nnx.remat` JAX's
    partial evaluation leaves those ys as copies of the weights the scan reads: the optimizer
    would read the layers' weights from the forward scan, tying a batch-independent value to
    the scan of the examples (which micro-batching and pipeline stages must run per
    micro-batch). A reverse scan stacks ys[i] at i too, so the forwarding holds for both.
    """
    jaxpr = closed.jaxpr
    subst: dict = {}
    read = lambda v: subst.get(v, v) if isinstance(v, jex_core.Var) else v  # noqa: E731
    eqns, changed = [], False
    for eqn in jaxpr.eqns:
        eqn = eqn.replace(invars=[read(v) for v in eqn.invars])
        name = eqn.primitive.name
        call = eqn.params.get("jaxpr")
        if name in ("jit", "pjit", "closed_call") and isinstance(call, jex_core.ClosedJaxpr):
            inner = _scan_xs_forwarded(call)
            if inner is not call:
                eqn, changed = eqn.replace(params={**eqn.params, "jaxpr": inner}), True
        elif name == "scan":
            params = region_params(eqn)
            nc, nk = params["num_consts"], params["num_carry"]
            body = eqn.params["jaxpr"].jaxpr
            xs = body.invars[nc + nk:]
            for out, y in zip(eqn.outvars[nk:], body.outvars[nk:]):
                if isinstance(y, jex_core.Var) and y in xs:
                    subst[out] = eqn.invars[nc + nk + xs.index(y)]
        eqns.append(eqn)
    if not (subst or changed):
        return closed
    return closed.replace(jaxpr=jaxpr.replace(eqns=eqns,
                                              outvars=[read(v) for v in jaxpr.outvars]))


def _dead_code_eliminated(closed):
    """The jaxpr without equations whose results nothing uses (XLA drops them too).

    Uses JAX's own `dce_jaxpr` (private: jax/_src/interpreters/partial_eval.py), which also
    prunes scan and while bodies; if it moves or fails, the jaxpr is used as it is.
    """
    try:
        from jax._src.interpreters import partial_eval as pe

        jaxpr, used_inputs = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars),
                                          instantiate=True)
        if not all(used_inputs):  # keep every input: the calling convention must not change
            jaxpr, _ = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars),
                                    instantiate=[True] * len(closed.jaxpr.invars))
        if len(jaxpr.invars) != len(closed.jaxpr.invars):
            return closed
        return closed.replace(jaxpr=jaxpr)
    except Exception:
        return closed


def _nest(outer: str, inner: str) -> str:
    """The scope of an equation inside an inlined call or a region body.

    `jit` bodies record name stacks relative to the call, but `remat` and some custom-rule
    bodies record the full stack: don't repeat a prefix that is already there.
    """
    if outer and (inner == outer or inner.startswith(outer + "/")):
        return inner
    return _join(outer, inner)


def _join(*parts: str) -> str:
    return "/".join(p for p in parts if p)


def _arg_names(fn, n: int) -> list[str]:
    """The names of `fn`'s first `n` positional parameters, from its signature — through
    `functools.partial` (the bound ones are not among them) and `jax.jit` and other wrappers
    that keep `__wrapped__`. Those past the named ones take the name of `*args`, with their
    place in it (`args/0`); `arg{i}` only where `fn` has no signature (a builtin)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return [f"arg{i}" for i in range(n)]
    names = [p.name for p in params
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:n]
    rest = next((p.name for p in params if p.kind == p.VAR_POSITIONAL), "arg")
    return names + [f"{rest}/{i - len(names)}" for i in range(len(names), n)]


def _path_name(path, arg_names: list[str]) -> str:
    """'params/blocks/0/attn/wq' from the key path of one leaf of (args, kwargs)."""
    parts = []
    for i, key in enumerate(path):
        if isinstance(key, jax.tree_util.SequenceKey):
            part = key.idx
        elif isinstance(key, jax.tree_util.DictKey):
            part = key.key
        elif isinstance(key, jax.tree_util.GetAttrKey):
            part = key.name
        elif isinstance(key, jax.tree_util.FlattenedIndexKey):
            part = key.key
        else:
            part = str(key)
        if i == 1 and path[0] == jax.tree_util.SequenceKey(0):  # a positional argument
            part = arg_names[part]
        if i > 0:
            parts.append(str(part))
    return "/".join(parts)


def _is_names_leaf(x) -> bool:
    # exactly a tuple: NamedTuples (optax states, even empty ones) are structure, not names
    return x is None or (type(x) is tuple and all(isinstance(e, (str, type(None))) for e in x))


def _names_of_leaf(names, i: int, leaf):
    """One array's dim names as a tuple (or None), refusing what is not a tuple of names: a
    str would otherwise be read as one name per character."""
    shape = tuple(jax.numpy.shape(leaf))
    if isinstance(names, str):
        words = tuple(names.replace(",", " ").split())
        if len(words) == len(shape):
            example = repr(words)
        elif len(names) == len(shape):
            example = repr(tuple(names))
        else:
            example = f"({names!r}, ...) with {len(shape)} names"
        raise TypeError(f"dim_names[{i}] gives the array of shape {shape} the str {names!r}, "
                        f"not a tuple of names: give one name per dim, e.g. {example}")
    if names is None:
        return None
    if not isinstance(names, (tuple, list)) or not all(
            isinstance(n, (str, type(None))) for n in names):
        raise TypeError(f"dim_names[{i}] gives the array of shape {shape} {names!r}: give a "
                        f"tuple of names (str, or None for an unnamed dim), one per dim")
    return tuple(names)


def _flatten_dim_names(dim_names, args, kwargs):
    """Per input leaf: a tuple of logical dim names, or None. Validates against the args."""
    hints = []
    if dim_names is not None and not isinstance(dim_names, (tuple, list)):
        raise TypeError(
            f"dim_names is a tuple with one entry per positional argument (None, or a pytree "
            f"shaped like that argument with a tuple of names per array), e.g. "
            f"dim_names=(param_names, None, (\"batch\", \"seq\")); got a "
            f"{type(dim_names).__name__}"
            + (f": for a {{...}} that names the first argument's arrays, write "
               f"dim_names=({{...}},{' None,' * (len(args) - 1)})"
               if isinstance(dim_names, dict) and args else ""))
    if dim_names is not None and len(dim_names) != len(args):
        raise ValueError(f"dim_names has {len(dim_names)} entries but the function takes "
                         f"{len(args)} positional arguments: give one entry (or None) per argument")
    for i, arg in enumerate(args):
        arg_leaves = jax.tree_util.tree_leaves(arg)
        names = None if dim_names is None else dim_names[i]
        if names is None:
            hints += [None] * len(arg_leaves)
            continue
        try:
            # Walk the names alongside the argument, argument first: a None in both (the
            # static half of an equinox partition) is structure, not a leaf of names.
            name_leaves = jax.tree_util.tree_structure(arg).flatten_up_to(names)
        except (TypeError, ValueError):  # another structure with the same leaves, e.g. lists
            name_leaves = jax.tree_util.tree_leaves(names, is_leaf=_is_names_leaf)
        if len(name_leaves) != len(arg_leaves):
            raise ValueError(f"dim_names[{i}] has {len(name_leaves)} leaves but argument {i} has "
                             f"{len(arg_leaves)}: it must have the argument's structure, with a "
                             f"tuple of names (one per dim) at each leaf")
        for leaf, nm in zip(arg_leaves, name_leaves):
            nm = _names_of_leaf(nm, i, leaf)
            if nm is not None and len(nm) != len(jax.numpy.shape(leaf)):
                raise ValueError(f"dim_names {nm} for an argument of shape "
                                 f"{tuple(jax.numpy.shape(leaf))}: give one name per dim")
            hints.append(nm)
    hints += [None] * len(jax.tree_util.tree_leaves(kwargs))
    return hints


def region_params(eqn) -> dict:
    """A region op's params, with a scan's `num_consts` and `num_carry` on every JAX version.

    JAX 0.11 dropped them from scan's params (and `linear`): its `ft_in` is a flat tree of
    three groups, (consts, carry, xs), whose lengths are those counts
    (jax/_src/lax/control_flow/loops.py, `ft_in.update(args).unpack()`). The rules, the domains
    and the cost model read the counts by their old names."""
    params = eqn.params
    if eqn.primitive.name != "scan" or "num_consts" in params:
        return params
    consts, carry, _ = params["ft_in"].unpack()
    return {**params, "num_consts": len(consts), "num_carry": len(carry)}
