"""What a pin names and what it pins to: the Lab's reading of `pin(name, value)`.

Names: a class or conflict by its exact name, always (a class may be called "out@parameters",
a conflict is called "seq@block0/attn/..."); otherwise "<class>@<domain>" names the class's
override in that domain ("embed@optimizer", as tl.search's pins name it), split at the last "@"
and only where the tail is a domain; the tuple ("embed", "optimizer") names the same override
whatever the class is called.

Values for a class: a tuple (or list) of mesh axis names, major to minor, always read as axis
names (("replicated",) is the axis of that name; the widget sends lists); () or None
replicate. A string is an axis name, or axes joined by "+" (or "×"), or "replicated" / "" for
none; on a mesh that has an axis called "replicated" that word is ambiguous and refused, with
both ways to write it.
"""

from __future__ import annotations

from ..analysis import DOMAINS, Conflict, DimClass

REPLICATED = "replicated"  # the word a string pin uses for no mesh axes


class PinError(ValueError):
    """A pin the session refuses: the message says why and what would work."""


def named(analysis, name) -> DimClass | Conflict | None:
    """The class or conflict called exactly `name` (or `name` itself, a DimClass or Conflict),
    else None."""
    if isinstance(name, (DimClass, Conflict)):
        return name
    for c in analysis.classes:
        if c.name == name:
            return c
    for c in analysis.conflicts:
        if c.name == name:
            return c
    return None


def decision(analysis, name) -> DimClass | Conflict:
    """The class or conflict `name` names; PinError listing close names where none."""
    found = named(analysis, name)
    if found is not None:
        return found
    names = [c.name for c in analysis.classes] + [c.name for c in analysis.conflicts]
    close = [n for n in names if str(name).lower() in n.lower()][:5]
    hint = f" Did you mean {close}?" if close else ""
    raise PinError(f"no class or conflict named {name!r}.{hint} Classes: "
                   f"{[c.name for c in analysis.classes]}; conflicts: "
                   f"{[c.name for c in analysis.conflicts]}")


def override(analysis, name) -> tuple[DimClass | Conflict, str] | None:
    """(class, domain) where `name` names an override (see the module docstring), else None."""
    if isinstance(name, (tuple, list)):
        if len(name) != 2 or not all(isinstance(x, str) for x in name):
            raise PinError(f"an override is named (class name, domain), e.g. ('embed', "
                           f"'optimizer'); got {name!r}")
        if name[1] not in DOMAINS:
            raise PinError(f"no domain {name[1]!r} in {tuple(name)!r}; domains: "
                           f"{list(DOMAINS)}")
        return decision(analysis, name[0]), name[1]
    if not isinstance(name, str) or named(analysis, name) is not None:
        return None
    cls, _, domain = name.rpartition("@")
    if not cls or domain not in DOMAINS:
        return None
    return decision(analysis, cls), domain


def pin_axes(cls: DimClass, value, mesh) -> tuple[str, ...]:
    """The mesh axes a class pin's `value` names (see the module docstring)."""
    if value is None:
        return ()
    if isinstance(value, str):
        if value == REPLICATED and REPLICATED in mesh.axis_names:
            raise PinError(f"pin {cls.name} to {value!r} is ambiguous: {mesh} has an axis "
                           f"called {value!r}, which is also the word for no axes; pin "
                           f"({value!r},) to shard over that axis, or () to replicate")
        if value in mesh.axis_names:  # a whole name first: an axis may be called "a+b"
            return (value,)
        if value in ("", REPLICATED):
            return ()
        return tuple(a for a in value.replace("×", "+").split("+") if a)
    try:
        axes = tuple(value)
    except TypeError:
        raise PinError(f"pin {cls.name} to mesh axes (a name or a tuple of names), got "
                       f"{value!r}") from None
    if not all(isinstance(a, str) for a in axes):
        raise PinError(f"mesh axes are names (str), got {value!r} for {cls.name}")
    return axes


__all__ = ["PinError", "REPLICATED", "decision", "named", "override", "pin_axes"]
