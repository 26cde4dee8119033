"""Verify a plan against XLA: what the compiled program really does (DESIGN.md §9)."""

from toast_lab.verify._collectives import (
    COLLECTIVE_KINDS as COLLECTIVE_KINDS,
    Collective as Collective,
    CollectiveTotal as CollectiveTotal,
    summarize_collectives as summarize_collectives,
)
from toast_lab.verify._compiled import (
    CompiledStats as CompiledStats,
    read_compiled as read_compiled,
)
from toast_lab.verify._parse_collectives import parse_collectives as parse_collectives
from toast_lab.verify._verify import (
    FAST_COMPILE as FAST_COMPILE,
    TOLERANCES as TOLERANCES,
    LeafCheck as LeafCheck,
    VerifyReport as VerifyReport,
    compare_outputs as compare_outputs,
    concrete_args as concrete_args,
    tolerance_of as tolerance_of,
    verify as verify,
)
