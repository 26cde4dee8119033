"""How many times each computation of an HLO module runs per step (DESIGN.md §9).

A collective inside a `lax.scan` body runs once per iteration; XLA records the loop's trip count
in the while's backend_config, and we multiply through the call graph.
"""

from __future__ import annotations

import re
from collections import defaultdict

from ._hlo_text import _QUOTED, _Instruction, _Module

# --- regexes, each with an example of what it reads ------------------------------------------

# body=%region_0.1_spmd    calls=%fused_computation    to_apply=%add.clone
_CALLED_COMPUTATION = re.compile(
    r"\b(?P<role>calls|to_apply|body|condition|true_computation|false_computation)"
    r"=%?(?P<name>[^\s,{}()]+)"
)
# branch_computations={%branch_0, %branch_1}    called_computations={%a, %b}
_CALLED_COMPUTATION_LIST = re.compile(
    r"\b(?:branch_computations|called_computations)=\{(?P<names>[^}]*)\}"
)

# backend_config={"known_trip_count":{"n":"5"}, ...}   (older: backend_config="{\"known...)
_KNOWN_TRIP_COUNT = re.compile(
    r'\\?"known_trip_count\\?"\s*:\s*\{\s*\\?"n\\?"\s*:\s*\\?"?(?P<n>\d+)'
)


# --- how often each computation runs ---------------------------------------------------------


def _computation_multipliers(module: _Module) -> dict[str, int]:
    """Executions per step of each computation: entry (or any uncalled computation) runs once;
    a while body runs its known trip count per execution of the while."""
    callers: dict[str, list[tuple[str, int]]] = defaultdict(list)
    names = {c.name for c in module.computations}
    for computation in module.computations:
        for instruction in computation.instructions:
            if instruction.opcode.endswith(("-update", "-done")):
                continue  # they name the async computation again; its start already did
            trip_count = _known_trip_count(instruction) if instruction.opcode == "while" else None
            attributes = _QUOTED.sub('""', instruction.attributes)
            called = [(m["role"], m["name"]) for m in _CALLED_COMPUTATION.finditer(attributes)]
            for listed in _CALLED_COMPUTATION_LIST.finditer(attributes):
                called += [("branch", n.strip().lstrip("%")) for n in listed["names"].split(",")]
            for role, callee in called:
                if callee in names:
                    factor = trip_count if (role == "body" and trip_count) else 1
                    callers[callee].append((computation.name, factor))

    memo: dict[str, int] = {}

    def multiplier(name: str, visiting: frozenset[str] = frozenset()) -> int:
        if name in memo:
            return memo[name]
        if name in visiting:  # a cycle cannot happen in valid HLO; do not loop forever
            return 1
        sites = callers.get(name)
        if not sites:
            result = 1
        else:
            result = sum(multiplier(c, visiting | {name}) * f for c, f in sites)
        memo[name] = result
        return result

    return {c.name: multiplier(c.name) for c in module.computations}


def _known_trip_count(instruction: _Instruction) -> int | None:
    match = _KNOWN_TRIP_COUNT.search(instruction.attributes)
    return int(match["n"]) if match else None
