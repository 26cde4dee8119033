"""Read an HLO module's text: its computations, their instructions, and shape sizes.

Only what the collective parser needs: each instruction's name, result shape, opcode, operands
and the attribute text after them; shapes are sized from `ELEMENT_BITS`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# Bits per element of each HLO primitive type.
ELEMENT_BITS = {
    "pred": 8,
    "s2": 2,
    "s4": 4,
    "s8": 8,
    "s16": 16,
    "s32": 32,
    "s64": 64,
    "u2": 2,
    "u4": 4,
    "u8": 8,
    "u16": 16,
    "u32": 32,
    "u64": 64,
    "f16": 16,
    "bf16": 16,
    "f32": 32,
    "f64": 64,
    "c64": 64,
    "c128": 128,
    "f4e2m1fn": 4,
    "f8e3m4": 8,
    "f8e4m3": 8,
    "f8e4m3fn": 8,
    "f8e4m3fnuz": 8,
    "f8e4m3b11fnuz": 8,
    "f8e5m2": 8,
    "f8e5m2fnuz": 8,
    "f8e8m0fnu": 8,
    "token": 0,
}

# --- regexes, each with an example of what it reads ------------------------------------------

# HloModule jit_f, is_scheduled=true, entry_computation_layout={...}, num_partitions=8
_NUM_PARTITIONS = re.compile(r"^HloModule\b.*?\bnum_partitions=(\d+)", re.MULTILINE)
_REPLICA_COUNT = re.compile(r"^HloModule\b.*?\breplica_count=(\d+)", re.MULTILINE)

# %region_0.1_spmd (param: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
# ENTRY %main.0_spmd (param: f32[2,4]) -> f32[8,8] {
_COMPUTATION_HEADER = re.compile(
    r"^(?P<entry>ENTRY\s+)?%?(?P<name>[^\s(){}=]+)\s*(?:\(.*\)\s*->\s*.*)?\{\s*$"
)

#   ROOT %all-reduce.1 = f32[8,16]{1,0} all-reduce(%dot.1), channel_id=1, ...
_INSTRUCTION = re.compile(r"^\s+(?:ROOT\s+)?%?(?P<name>[^\s=]+)\s*=\s*(?P<rest>.*)$")

# all-reduce(        get-tuple-element(        collective-permute-start(
_OPCODE = re.compile(r"\s*(?P<opcode>[a-z][\w\-.]*)\(")

# (s32[], f32[8,8], /*index=5*/f32[5,16,8])
_COMMENT = re.compile(r"/\*.*?\*/")

# f32[8,16]{1,0}   bf16[<=128,4]   u32[]   f32[8]{0:S(1)}
_ARRAY_SHAPE = re.compile(r"\b(?P<dtype>[a-z][a-z0-9]*)\[(?P<dims>[^\]]*)\]")

# Any double-quoted string, to blank out before reading attributes.
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


# --- the module's structure ------------------------------------------------------------------


@dataclass(frozen=True)
class _Instruction:
    name: str
    shape: str
    opcode: str
    operands: tuple[tuple[str, str | None], ...]  # (name, shape printed inline or None)
    attributes: str  # everything after the operands, quoted strings intact
    line: str


@dataclass(frozen=True)
class _Computation:
    name: str
    is_entry: bool
    instructions: tuple[_Instruction, ...]


@dataclass(frozen=True)
class _Module:
    computations: tuple[_Computation, ...]
    num_partitions: int | None
    replica_count: int | None


def _parse_module(text: str) -> _Module:
    computations = []
    current: tuple[str, bool] | None = None
    body: list[_Instruction] = []
    for raw in text.splitlines():
        line = _COMMENT.sub("", raw.rstrip())
        if current is None:
            if line[:1].isspace() or line.startswith("HloModule"):
                continue
            header = _COMPUTATION_HEADER.match(line)
            if header:
                current = (header["name"], bool(header["entry"]))
                body = []
            continue
        if line.startswith("}"):
            computations.append(_Computation(current[0], current[1], tuple(body)))
            current = None
            continue
        instruction = _parse_instruction(line)
        if instruction is not None:
            body.append(instruction)
    if current is not None:  # a snippet without its closing brace
        computations.append(_Computation(current[0], current[1], tuple(body)))
    partitions = _NUM_PARTITIONS.search(text)
    replicas = _REPLICA_COUNT.search(text)
    return _Module(
        tuple(computations),
        int(partitions.group(1)) if partitions else None,
        int(replicas.group(1)) if replicas else None,
    )


def _parse_instruction(line: str) -> _Instruction | None:
    match = _INSTRUCTION.match(line)
    if not match:
        return None
    rest = match["rest"].strip()
    shape, rest = _take_shape(rest)
    opcode = _OPCODE.match(rest)
    if shape is None or not opcode:
        return None
    operands_text, attributes = _take_parenthesized(rest, opcode.end() - 1)
    operands = tuple(_parse_operand(o) for o in _split_top_level(operands_text) if o.strip())
    return _Instruction(match["name"], shape, opcode["opcode"], operands, attributes, line)


def _take_shape(text: str) -> tuple[str | None, str]:
    """Split 'f32[8]{0} add(...)' or '(f32[8], s32[]) tuple(...)' into shape and the rest."""
    if text.startswith("("):
        shape, rest = _take_parenthesized(text, 0)
        return "(" + shape + ")", rest
    parts = text.split(None, 1)
    if len(parts) != 2:
        return None, text
    return parts[0], parts[1]


def _take_parenthesized(text: str, start: int) -> tuple[str, str]:
    """The text inside the parentheses opening at `start`, and what follows them."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], text[i + 1 :]
    return text[start + 1 :], ""


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside (), {} or []."""
    parts, depth, begin = [], 0, 0
    for i, char in enumerate(text):
        if char in "({[":
            depth += 1
        elif char in ")}]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[begin:i])
            begin = i + 1
    parts.append(text[begin:])
    return parts


def _parse_operand(text: str) -> tuple[str, str | None]:
    """'%dot.1' or 'f32[8,16]{1,0} %dot.1' (older printers) -> (name, inline shape)."""
    text = text.strip()
    if " " in text:
        shape, name = text.rsplit(None, 1)
        return name.lstrip("%"), shape
    return text.lstrip("%"), None


def _shape_bytes(shape: str, line: str = "") -> int:
    """Bytes of an array or tuple shape; dynamic dims count at their bound."""
    bits = 0
    for array in _ARRAY_SHAPE.finditer(shape):
        dtype = array["dtype"]
        if dtype not in ELEMENT_BITS:
            raise ValueError(
                f"Unknown HLO element type {dtype!r} in shape {shape!r}"
                + (f" of line:\n  {line.strip()}" if line else "")
                + f"\nKnown types: {', '.join(sorted(ELEMENT_BITS))}."
            )
        dims = [d.strip().lstrip("<=") for d in array["dims"].split(",") if d.strip()]
        count = math.prod(int(d) for d in dims if d.isdigit())
        bits += ELEMENT_BITS[dtype] * count
    return (bits + 7) // 8


def _shape_dtypes(shape: str) -> list[str]:
    return [m["dtype"] for m in _ARRAY_SHAPE.finditer(shape)]


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]
