"""Verify a plan against XLA: what the compiled program really does (DESIGN.md §9)."""

from toast_lab.verify._hlo import (
    COLLECTIVE_KINDS as COLLECTIVE_KINDS,
    Collective as Collective,
    CollectiveTotal as CollectiveTotal,
    CompiledStats as CompiledStats,
    parse_collectives as parse_collectives,
    read_compiled as read_compiled,
    summarize_collectives as summarize_collectives,
)
