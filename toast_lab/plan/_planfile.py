"""Plan files: versioned JSON, read without executing anything (DESIGN.md §8).

This module knows the file format only (JSON <-> plain decisions); `Plan.save` / `Plan.load`
turn decisions into a Plan.

A file names its decisions by class and conflict *names*, which are deterministic for a given
program, and carries the program's fingerprint so a plan for another program fails clearly.

    {"format": "toast-lab-plan", "version": 3,
     "program": {"name": "gpt_train_step", "fingerprint": "3f2a...", "classes": 8},
     "mesh": {"axes": {"data": 4, "model": 2}, "device": "h100-80gb"},  # "device_spec": see below
     "classes": {"batch": ["data"], "heads": ["model"]},          # decision order kept
     "conflicts": {"seq@block0/attn/...": "keep_dim2"},
     "overrides": {"embed": {"parameters": ["fsdp"]}},              # only when there are any
     "step": {"remat": {"block*": "full"}, "micro_batches": 4,      # v3, only when not as written
              "pipeline": {"group": "block", "axis": "stage", "stages": 4, "schedule": "gpipe",
                           "chunks": 1}},
     "pinned": ["batch"],
     "estimate": {...},                                             # optional, informative
     "experts": [{"name": "dp", "step_time_s": ..., ...}],          # v2, optional, informative
     "view": {"format": "toast-lab-view", ...}}                     # v2, optional, for display

Version 2 added "overrides" (a class's axes in one domain of the step, see plan/_plan.py; only
present when a plan has some) and "experts" and "view": what the JupyterLab extension draws
without a kernel (the view model, toast_lab/lab/_viewmodel.py). Those two are informative:
loading a plan never reads them, and skips the view's text without parsing it (_skip.py), so
no size or nesting depth there can break a load. Version 3 added "step": the decisions beyond
sharding (plan/_decisions.py: "remat", {layer group: policy}; "micro_batches", a count;
"override", the groups whose own jax.checkpoint the plan replaces; "pipeline", a scanned
stack cut into stages over a mesh axis, plan/_pipeline.py), present only where a plan has
some. Version 1 and 2 files load unchanged, as the step as written.

The mesh section names the device; where the device is not the preset of that name (one made
with `dataclasses.replace(preset, ...)` keeps the preset's name; one of the user's own has a
name no preset has) it also carries "device_spec": every figure of the device
(hardware.device_numbers) and its "source"; a mesh with its own links for some axes
carries them in "links". Loading uses those, so the plan comes back for the
device it was made for; a file without it (a preset, or written before it existed) names a
preset, and a device that is not one is not remembered (a ToastWarning says so).

Reading is strict: anything but a regular file is refused unopened, at most MAX_BYTES are read,
a key given twice in one object is an error (JSON parsers keep the last silently), and a mesh
section that is malformed, absurdly large or does not fit the decisions is an error naming
"mesh", never a plan that quietly forgets its mesh. Writing is atomic and does not replace a
file that is not a plan file unless asked (_files.py).
"""

from __future__ import annotations

import json
import os
import stat
import warnings
from pathlib import Path
from typing import Any

from ..analysis import DOMAINS, ToastWarning
from . import _skip
from ._decisions import REFUSED_POLICIES, REMAT_POLICIES, StepDecisions
from ._files import write_file
from ._hardware import (device_from_numbers, device_numbers, get_device, is_preset,
                        link_from_numbers, link_numbers)
from ._pipeline import Pipeline

FORMAT = "toast-lab-plan"
VERSION = 3        # what this toast-lab writes; it reads 1 to 3


class PlanFileError(ValueError):
    """A plan file that cannot be loaded: says which file, what is wrong and what to do."""


def plan_to_dict(plan, mesh=None, estimate: dict | None = None, experts: list | None = None,
                 view: dict | None = None) -> dict[str, Any]:
    """The file's document for `plan` (a Plan; read through its public attributes), with the
    informative sections that are given."""
    an = plan.analysis
    prog = an.program
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "program": {"name": prog.fn_name, "fingerprint": prog.fingerprint(),
                    "classes": len(an.classes), "conflicts": len(an.conflicts)},
        "mesh": None if mesh is None else _mesh_section(mesh),
        "classes": {an.classes[k].name: list(axes) for k, axes in plan.assignments},
        "conflicts": plan.conflict_resolutions,
        "pinned": sorted(plan.pinned),
    }
    if plan.overrides:
        overrides: dict[str, dict[str, list[str]]] = {}
        for k, domain, axes in plan.overrides:
            overrides.setdefault(an.classes[k].name, {})[domain] = list(axes)
        doc["overrides"] = overrides
    if not plan.step.is_default:
        doc["step"] = step_section(plan.step)
    if estimate is not None:
        doc["estimate"] = estimate
    if experts:
        doc["experts"] = experts
    if view is not None:
        doc["view"] = view
    return doc


def _mesh_section(mesh) -> dict[str, Any]:
    """The mesh section: axes and device name, and the device's figures unless the name alone
    says them (a preset)."""
    section: dict[str, Any] = {"axes": dict(mesh.shape), "device": mesh.device.name}
    if not is_preset(mesh.device):
        section["device_spec"] = {**device_numbers(mesh.device), "source": mesh.device.source}
    if mesh.links:
        section["links"] = {axis: link_numbers(link) for axis, link in mesh.links.items()}
    return section


def to_text(doc: dict) -> str:
    """The file's text: the decisions indented for people and diffs; the view model, last and
    on one line (tens of kilobytes a person does not read, for the extension)."""
    head = {k: v for k, v in doc.items() if k != "view"}
    text = _dumps(head, "")
    if doc.get("view") is not None:
        view = json.dumps(doc["view"], separators=(",", ":"), allow_nan=False)
        text = f'{text[:-2]},\n  "view": {view}\n}}'
    return text + "\n"


def _dumps(x, pad: str) -> str:
    """JSON indented by two spaces, with lists of plain values on one line (mesh axes)."""
    if isinstance(x, dict) and x:
        inner = pad + "  "
        items = ",\n".join(f"{inner}{json.dumps(str(k))}: {_dumps(v, inner)}"
                           for k, v in x.items())
        return "{\n" + items + "\n" + pad + "}"
    if isinstance(x, list) and any(isinstance(v, (dict, list)) for v in x):
        inner = pad + "  "
        return "[\n" + ",\n".join(inner + _dumps(v, inner) for v in x) + "\n" + pad + "]"
    return json.dumps(x, allow_nan=False)


PLAN_FILE = "toast-lab plan file"  # what a refusal to overwrite calls the kind written


def write(doc: dict, path, overwrite: bool = False) -> Path:
    """Writes `doc` to `path` atomically (_files.write_file): the text is made first, so a
    document that cannot be written leaves the file as it was. An existing file is replaced
    when it is a plan file (an earlier save of this or any plan) or empty; anything else only
    with overwrite=True (else ExistingFileError, a FileExistsError naming the file)."""
    return write_file(path, to_text(doc), overwrite=overwrite, replaceable=is_plan_file,
                      kind=PLAN_FILE)


def is_plan_file(path) -> bool:
    """Whether `path` holds a toast-lab plan file (any version, for any program)."""
    try:
        doc = read(path)
    except PlanFileError:
        return False
    return isinstance(doc, dict) and doc.get("format") == FORMAT


MAX_BYTES = 64 * 2**20  # a plan file is kilobytes; refuse to read a disk image by mistake
MAX_DEVICES = 2**20     # the most devices a plan file's mesh may have (today's largest
                        # clusters have about 10^5); more is a corrupted file
_ECHO = 60  # longest piece of a file's content an error message repeats


def echo(value) -> str:
    """repr(value), shortened: errors quote what the file says without flooding the terminal."""
    text = repr(value)
    return text if len(text) <= _ECHO else text[:_ECHO - 3] + "..."


def shorten(message: str, limit: int = 400) -> str:
    """A whole message, shortened (it may quote a hand-edited name of any length)."""
    return message if len(message) <= limit else message[:limit - 3] + "..."


def read(path) -> dict:
    """The document stored in `path`. Raises PlanFileError when it is not a JSON plan file:
    not a regular file (a directory, a FIFO, a device), unreadable, too large, not UTF-8, not
    JSON, a key twice in one object, nested too deeply, or a number too long."""
    path = Path(path)
    raw = _read_bytes(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise PlanFileError(f"{path}: not UTF-8 text (byte {raw[err.start]:#04x} at offset "
                            f"{err.start}); a plan file is JSON written by toast-lab: was it "
                            f"saved by another program or corrupted?") from None
    try:
        # plain JSON: no pickle, no eval, nothing executes; the view is skipped unread
        return json.loads(_skip.without_member(text, "view"), object_pairs_hook=_unique_keys)
    except _DuplicateKey as err:
        raise PlanFileError(f"{path}: the key {echo(err.key)} appears twice in one JSON object "
                            f"(in {err.where}); a plan file names each decision once: remove "
                            f"one of them") from None
    except json.JSONDecodeError as err:
        raise PlanFileError(f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: "
                            f"{err.msg}); the file is corrupted or was not written by toast-lab"
                            ) from None
    except RecursionError:
        raise PlanFileError(f"{path}: JSON nested too deeply to be a plan file (a plan file "
                            f"nests 3 levels); the file is corrupted") from None
    except ValueError as err:  # Python's limit on integer digits (CVE-2020-10735)
        raise PlanFileError(f"{path}: a number in the file is too long to read "
                            f"({str(err).split(';')[0]}); the file is corrupted") from None


_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                (stat.S_ISSOCK, "a socket"))


def _read_bytes(path: Path) -> bytes:
    """At most MAX_BYTES of a regular file. What the file system reports about a size is not
    trusted (/dev/zero reports 0 and never ends; a FIFO blocks until a writer comes): anything
    but a regular file is refused before it is opened, it is opened without blocking, and the
    read stops one byte past the limit."""

    def refuse(mode: int) -> None:
        kind = next((name for test, name in _NOT_REGULAR if test(mode)), "not a regular file")
        raise PlanFileError(f"{path}: {kind}, not a plan file (a plan file is a regular JSON "
                            f"file written by plan.save or lab.export); check the path")

    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            refuse(mode)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_BINARY", 0))
        with os.fdopen(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode  # what was opened, if the name moved since
            if not stat.S_ISREG(mode):
                refuse(mode)
            raw = f.read(MAX_BYTES + 1)
    except OSError as err:
        raise PlanFileError(f"cannot read plan file {str(path)!r}: {err.strerror or err}"
                            ) from None
    if len(raw) > MAX_BYTES:
        raise PlanFileError(f"{path}: more than {MAX_BYTES} bytes is not a plan file (plan "
                            f"files are kilobytes); check the path")
    return raw


class _DuplicateKey(ValueError):
    def __init__(self, key: str, where: str):
        super().__init__(key)
        self.key, self.where = key, where


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """json's object_pairs_hook: the object, or _DuplicateKey for a key given twice (json
    keeps the last one, silently)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            keys = [k for k, _ in pairs]
            where = "the object with keys " + echo(list(dict.fromkeys(keys)))
            raise _DuplicateKey(key, where)
        out[key] = value
    return out


def overrides(doc, source: str = "<dict>", mesh=None) -> list[tuple[str, str, tuple[str, ...]]]:
    """[(class name, domain, axes)] of a plan document's "overrides" section (none in format
    1 files), each axis checked against `mesh` (when given, else the file's own mesh section)
    like the "classes" section's. Call after `decisions`, which checks the rest of the
    document."""
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

    def fail(msg: str):
        raise PlanFileError(f"{source}: {msg}")

    _check_axes({f"{n}@{d}": a for n, d, a in out}, _file_mesh(doc.get("mesh"), fail), mesh,
                fail, "override", "overrides")
    return out


def step_section(step) -> dict[str, Any]:
    """The "step" section of StepDecisions `step` (only the fields not as written)."""
    out: dict[str, Any] = {}
    if step.remat:
        out["remat"] = dict(step.remat)
    if step.micro_batches != 1:
        out["micro_batches"] = step.micro_batches
    if step.override:
        out["override"] = sorted(step.override)
    if step.pipeline is not None:
        p = step.pipeline
        out["pipeline"] = {"group": p.group, "axis": p.axis, "stages": p.stages,
                           "schedule": p.schedule, "chunks": p.chunks}
    return out


def step_decisions(doc, source: str = "<dict>"):
    """The StepDecisions of a plan document's "step" section (as written where it has none:
    files of format 1 and 2, and plans without such decisions). Each field's type is checked
    here, naming it; whether the groups and the count fit the program, by the Plan."""
    section = doc.get("step", {}) if isinstance(doc, dict) else {}

    def fail(msg: str):
        raise PlanFileError(f"{source}: the \"step\" section's {msg}")

    if not isinstance(section, dict):
        raise PlanFileError(f"{source}: \"step\" must be an object like {{\"remat\": "
                            f"{{\"block*\": \"full\"}}, \"micro_batches\": 4}}, got "
                            f"{echo(section)}")
    unknown = sorted(set(section) - {"remat", "micro_batches", "override", "pipeline"})
    if unknown:
        fail(f"field {echo(unknown[0])} is unknown; its fields are \"remat\", "
             f"\"micro_batches\", \"override\" and \"pipeline\"")
    remat = section.get("remat", {})
    if not isinstance(remat, dict) or not all(isinstance(k, str) for k in remat):
        fail(f"\"remat\" must map layer group names to policies, got {echo(remat)}")
    for group, policy in remat.items():
        if policy in REFUSED_POLICIES:
            fail(f"\"remat\" gives group {echo(group)} the policy {echo(policy)}: "
                 f"{REFUSED_POLICIES[policy]}")
        if policy not in REMAT_POLICIES:
            fail(f"\"remat\" gives group {echo(group)} the policy {echo(policy)}; policies "
                 f"are {list(REMAT_POLICIES)}")
    count = section.get("micro_batches", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        fail(f"\"micro_batches\" must be a positive integer, got {echo(count)}")
    override = section.get("override", [])
    if not isinstance(override, list) or not all(isinstance(g, str) for g in override):
        fail(f"\"override\" must be a list of layer group names, got {echo(override)}")
    return StepDecisions(tuple(remat.items()), count, frozenset(override),
                         _pipeline(section.get("pipeline"), fail))


def _pipeline(section, fail):
    """The Pipeline of a "pipeline" field (None where there is none)."""
    if section is None:
        return None
    fields = {"group": str, "axis": str, "stages": int, "schedule": str, "chunks": int}
    words = {str: "a string", int: "an integer"}
    if not isinstance(section, dict) or set(section) - set(fields) or \
            not {"group", "axis", "stages"} <= set(section):
        fail(f"\"pipeline\" must be an object like {{\"group\": \"block\", \"axis\": "
             f"\"stage\", \"stages\": 4, \"schedule\": \"gpipe\"}}, got {echo(section)}")
    defaults = {"schedule": "gpipe", "chunks": 1}
    for name, kind in fields.items():
        value = section.get(name, defaults.get(name))
        if isinstance(value, bool) or not isinstance(value, kind):
            fail(f"\"pipeline\" field {echo(name)} must be {words[kind]}, got "
                 f"{echo(value)}")
    if section["stages"] < 2:
        fail(f"\"pipeline\" needs at least 2 stages, got {echo(section['stages'])}")
    return Pipeline(section["group"], section["axis"], section["stages"],
                    section.get("schedule", "gpipe"), section.get("chunks", 1))


def decisions(doc, program, source: str = "<dict>", check_fingerprint: bool = True,
              mesh=None):
    """(classes, conflicts, pinned) of a plan document checked against `program` (and `mesh`,
    when given): [(class name, axes)] in decision order, {conflict name: resolution},
    [decision names]."""

    def fail(msg: str):
        raise PlanFileError(f"{source}: {msg}")

    if not isinstance(doc, dict):
        fail(f"not a toast-lab plan file (a JSON {type(doc).__name__}, not an object with "
             f"\"format\": \"{FORMAT}\")")
    if doc.get("format") != FORMAT:
        fail(f"not a toast-lab plan file (\"format\" is {echo(doc.get('format'))}, expected "
             f"\"{FORMAT}\")")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        fail(f"\"version\" must be a positive integer (this toast-lab writes {VERSION}), got "
             f"{echo(version)}")
    if version > VERSION:  # 1 to 3 differ only in sections an older file does without
        fail(f"written by a newer toast-lab (plan format {version}; this one reads up to "
             f"{VERSION}): upgrade toast-lab")
    meta = doc.get("program")
    if not isinstance(meta, dict):
        fail("missing the \"program\" section")
    if check_fingerprint and meta.get("fingerprint") != program.fingerprint():
        fail(f"made for another program ({echo(meta.get('name'))}, fingerprint "
             f"{echo(meta.get('fingerprint'))}) than this one ({program.fn_name!r}, fingerprint "
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
    _check_axes(classes, _file_mesh(doc.get("mesh"), fail), mesh, fail)
    return [(k, tuple(v)) for k, v in classes.items()], dict(conflicts), list(pinned)


def _file_mesh(section, fail) -> dict | None:
    """The file's own {axis: size}, checked; None when it has no mesh section."""
    if section is None:
        return None
    axes = section.get("axes") if isinstance(section, dict) else None
    if not isinstance(axes, dict) or not axes or not all(
            isinstance(k, str) and k and isinstance(v, int) and not isinstance(v, bool)
            and v > 0 for k, v in axes.items()):
        fail(f"\"mesh\" must look like {{\"axes\": {{\"data\": 4, \"model\": 2}}, "
             f"\"device\": ...}} (named axes, positive sizes), got {echo(section)}")
    devices = 1
    for size in axes.values():
        devices *= size
        if devices > MAX_DEVICES:
            fail(f"\"mesh\": axes {echo(axes)} make more than {MAX_DEVICES} devices, which is "
                 f"no mesh a plan is made for; the file is corrupted or hand-edited: fix its "
                 f"\"mesh\" section")
    return dict(axes)


def _check_axes(classes, file_axes, mesh, fail, kind: str = "class",
                section: str = "classes") -> None:
    """Every axis a class (or override: `kind`, in the file's `section`) uses is in the mesh
    (the one given, else the file's own), and the file's mesh section agrees with the mesh
    given."""
    given = None if mesh is None else dict(mesh.shape)
    if given is not None and file_axes is not None and file_axes != given:
        fail(f"the plan was saved for mesh {axes_text(file_axes)} but is loaded for mesh "
             f"{axes_text(given)}; load it with the mesh it was made for, or search a plan "
             f"for this one")
    axes = given if given is not None else file_axes
    if axes is None:
        return
    for name, used in classes.items():
        missing = [a for a in used if a not in axes]
        if missing:
            fail(f"{kind} {echo(name)} is sharded over {echo(missing[0])}, which mesh "
                 f"{axes_text(axes)} does not have (axes: {', '.join(axes)}); fix the axis name "
                 f"in the file's \"{section}\" section")


def axes_text(axes: dict) -> str:
    """{'data': 4, 'model': 2} -> '(data=4, model=2)'."""
    return "(" + ", ".join(f"{k}={v}" for k, v in axes.items()) + ")"


def file_mesh(doc, source: str = "<dict>", warn: bool = True):
    """The Mesh of a plan document's mesh section, or None where it has none or names a device
    that is neither a preset nor described by a "device_spec" (a ToastWarning says so, when
    `warn`). Raises PlanFileError for a "device_spec" that is not a device's figures. Call
    after `decisions`."""
    from ._mesh import Mesh

    def fail(msg: str):
        raise PlanFileError(f"{source}: {msg}")

    section = doc.get("mesh") if isinstance(doc, dict) else None
    axes = _file_mesh(section, fail)
    if axes is None:
        return None
    links = section.get("links") or {}
    if not isinstance(links, dict):
        fail(f"the mesh section's \"links\" must map mesh axes to {{\"bandwidth\": bytes/s, "
             f"\"latency\": seconds}}, got {echo(links)}")
    try:
        links = {axis: link_from_numbers(f"links[{axis!r}]", v) for axis, v in links.items()}
        Mesh(axes, links=links)
    except (TypeError, ValueError) as err:
        fail(shorten(f"the mesh section's \"links\": {err}"))
    name = section.get("device")
    numbers = section.get("device_spec")
    if numbers is None:
        try:
            device = get_device(name)
        except ValueError:  # a device of the user's own, from before device_spec
            if warn:
                warnings.warn(f"{source}: the \"mesh\" section names device {echo(name)}, "
                              f"which is no preset (tl.devices()), and has no \"device_spec\" "
                              f"with its figures: the plan is loaded without a mesh. Pass the "
                              f"mesh it is for: Plan.load(path, analysis, mesh=tl.Mesh(...))",
                              ToastWarning, stacklevel=4)
            return None
        return Mesh(axes, device=device, links=links)
    if not isinstance(name, str) or not name.strip():
        fail(f"the mesh section's \"device\" must be the device's name (a str), got "
             f"{echo(name)}")
    try:
        device = device_from_numbers(name, numbers)
    except (TypeError, ValueError) as err:
        try:
            fix = (f"fix it, or remove \"device_spec\" to use the preset "
                   f"{get_device(name).name!r}")
        except ValueError:
            fix = "fix it: it holds the device's figures as tl.DeviceSpec takes them"
        fail(shorten(f"the mesh section's \"device_spec\" does not describe a device: "
                     f"{str(err).rstrip('.')} ({fix})", 600))
    return Mesh(axes, device=device, links=links)
