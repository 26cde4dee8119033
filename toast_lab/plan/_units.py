"""Byte counts as people read them: in the unit that shows the number (never `0.00 GiB`)."""

from __future__ import annotations

import math

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float) -> str:
    """'512 B', '3.5 KiB', '12.3 MiB', '1.25 GiB': the largest binary unit that keeps the
    number at least 1, with three significant digits."""
    if n is None or not math.isfinite(n):
        return f"{n} B"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    k = 0
    while n >= 1024 and k < len(_UNITS) - 1:
        n /= 1024
        k += 1
    if k == 0:
        return f"{sign}{n:.0f} B"
    digits = 2 if n < 10 else 1 if n < 100 else 0
    return f"{sign}{n:.{digits}f} {_UNITS[k]}"
