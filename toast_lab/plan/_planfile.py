"""Plan files: versioned JSON, read without executing anything (DESIGN.md §8).

This module knows the file format only (JSON <-> plain decisions); `Plan.save` / `Plan.load`
turn decisions into a Plan.

A file names its decisions by class and conflict *names*, which are deterministic for a given
program, and carries the program's fingerprint so a plan for another program fails clearly.

    {"format": "toast-lab-plan", "version": 1,
     "program": {"name": "gpt_train_step", "fingerprint": "3f2a...", "classes": 8},
     "mesh": {"axes": {"data": 4, "model": 2}, "device": "h100-80gb"},
     "classes": {"batch": ["data"], "heads": ["model"]},          # decision order kept
     "conflicts": {"seq@block0/attn/...": "keep_dim2"},
     "overrides": {"embed": {"parameters": ["fsdp"]}},              # only when there are any
     "pinned": ["batch"],
     "estimate": {...}}                                             # optional, informative

Format 2 adds "overrides" (a class's axes in one domain of the step, see plan/_plan.py). A plan
without overrides is still written as format 1, which every version reads; one with overrides
is format 2, which a toast-lab that cannot apply them refuses (rather than silently dropping
them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..analysis import DOMAINS

FORMAT = "toast-lab-plan"
VERSION = 2


class PlanFileError(ValueError):
    """A plan file that cannot be loaded: says which file, what is wrong and what to do."""


def plan_to_dict(plan, mesh=None, estimate: dict | None = None) -> dict[str, Any]:
    """The file's document for `plan` (a Plan; read through its public attributes)."""
    an = plan.analysis
    prog = an.program
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "program": {"name": prog.fn_name, "fingerprint": prog.fingerprint(),
                    "classes": len(an.classes), "conflicts": len(an.conflicts)},
        "mesh": None if mesh is None else {"axes": dict(mesh.shape), "device": mesh.device.name},
        "classes": {an.classes[k].name: list(axes) for k, axes in plan.assignments},
        "conflicts": plan.conflict_resolutions,
        "pinned": sorted(plan.pinned),
    }
    if plan.overrides:
        doc["version"] = 2
        overrides: dict[str, dict[str, list[str]]] = {}
        for k, domain, axes in plan.overrides:
            overrides.setdefault(an.classes[k].name, {})[domain] = list(axes)
        doc["overrides"] = overrides
    else:
        doc["version"] = 1  # readable by every toast-lab
    if estimate is not None:
        doc["estimate"] = estimate
    return doc


def write(doc: dict, path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def read(path) -> dict:
    """The document stored in `path`. Raises PlanFileError when it is not JSON."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise PlanFileError(f"cannot read plan file {str(path)!r}: {err}") from None
    try:
        return json.loads(text)  # plain JSON: no pickle, no eval, nothing executes
    except json.JSONDecodeError as err:
        raise PlanFileError(f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: "
                            f"{err.msg}); the file is corrupted or was not written by toast-lab"
                            ) from None


def overrides(doc, source: str = "<dict>") -> list[tuple[str, str, tuple[str, ...]]]:
    """[(class name, domain, axes)] of a plan document's "overrides" section (none in format
    1 files). Call after `decisions`, which checks the rest of the document."""
    section = doc.get("overrides", {}) if isinstance(doc, dict) else {}
    ok = isinstance(section, dict) and all(
        isinstance(k, str) and isinstance(v, dict) and all(
            isinstance(d, str) and isinstance(a, list) and all(isinstance(x, str) for x in a)
            for d, a in v.items()) for k, v in section.items())
    if not ok:
        raise PlanFileError(f"{source}: \"overrides\" must map class names to {{domain: list "
                            f"of mesh axis names}}, e.g. {{\"embed\": {{\"parameters\": "
                            f"[\"fsdp\"]}}}}")
    out = []
    for name, by_domain in section.items():
        for domain, axes in by_domain.items():
            if domain not in DOMAINS:
                raise PlanFileError(f"{source}: override of class {name!r} names domain "
                                    f"{domain!r}; domains are {list(DOMAINS)}")
            out.append((name, domain, tuple(axes)))
    return out


def decisions(doc, program, source: str = "<dict>", check_fingerprint: bool = True):
    """(classes, conflicts, pinned) of a plan document checked against `program`:
    [(class name, axes)] in decision order, {conflict name: resolution}, [decision names]."""

    def fail(msg: str):
        raise PlanFileError(f"{source}: {msg}")

    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        fail(f"not a toast-lab plan file (expected \"format\": \"{FORMAT}\")")
    version = doc.get("version")
    if not isinstance(version, int) or version < 1:
        fail(f"bad version {version!r}")
    if version > VERSION:
        fail(f"written by a newer toast-lab (plan format {version}; this one reads up to "
             f"{VERSION}): upgrade toast-lab")
    meta = doc.get("program")
    if not isinstance(meta, dict):
        fail("missing the \"program\" section")
    if check_fingerprint and meta.get("fingerprint") != program.fingerprint():
        fail(f"made for another program ({meta.get('name')!r}, fingerprint "
             f"{meta.get('fingerprint')}) than this one ({program.fn_name!r}, fingerprint "
             f"{program.fingerprint()}): re-trace the same function with the same argument "
             f"shapes, or pass check_fingerprint=False to apply it by class names")
    classes = doc.get("classes", {})
    conflicts = doc.get("conflicts", {})
    pinned = doc.get("pinned", [])
    if not isinstance(classes, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(a, str) for a in v)
            for k, v in classes.items()):
        fail("\"classes\" must map class names to lists of mesh axis names")
    if not isinstance(conflicts, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in conflicts.items()):
        fail("\"conflicts\" must map conflict names to resolution names")
    if not isinstance(pinned, list) or not all(isinstance(p, str) for p in pinned):
        fail("\"pinned\" must be a list of decision names")
    return [(k, tuple(v)) for k, v in classes.items()], dict(conflicts), list(pinned)
