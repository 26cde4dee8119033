"""Small groups of arrays that the kernel's per-element helpers read together.

A phase binds what it needs of the tables and the workspace once, at its top (a StructRef's
field costs a load and a reference count each time it is read, too much inside a loop over
every operand), and hands the helpers it calls per element a view: a NamedTuple of a few
arrays, as cheap to read as locals.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class OperandView(NamedTuple):
    """The operands under one plan: the OPERAND, operand-row and ROW tables (TypeTables), the
    ROW_STATE and OPERAND_STATE records of the classification (_operands.py), and the value
    types' masks."""

    operands: np.ndarray
    operand_rows: np.ndarray
    rows: np.ndarray
    rstate: np.ndarray
    ostate: np.ndarray
    vmask: np.ndarray
