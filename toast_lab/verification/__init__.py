"""Stage 9, verification (DESIGN.md §9): compile a plan with XLA on simulated CPU devices, check
its numerics against the unsharded function, and read what XLA really did — memory per device,
flops, and the collectives in the HLO text (every replica-group syntax, tuple-shaped combined
all-reduces). Takes a function, its arguments, a Plan and a Mesh; gives a `VerifyReport` with
the cost model's estimate beside XLA's figures.
"""

from ._collectives import (
    XLA_COLLECTIVE_KINDS as XLA_COLLECTIVE_KINDS,
    Collective as Collective,
    CollectiveTotal as CollectiveTotal,
    summarize_collectives as summarize_collectives,
)
from ._compiled import (
    CompiledStats as CompiledStats,
    read_compiled as read_compiled,
)
from ._parse_collectives import parse_collectives as parse_collectives
from ._verify import (
    FAST_COMPILE as FAST_COMPILE,
    TOLERANCES as TOLERANCES,
    LeafCheck as LeafCheck,
    VerifyReport as VerifyReport,
    compare_outputs as compare_outputs,
    concrete_args as concrete_args,
    tolerance_of as tolerance_of,
    verify as verify,
)
