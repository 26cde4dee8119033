"""Stage 3, the analysis (DESIGN.md §3): `analyze(program)` unions (value, dim) nodes through
every factor of every op's rule and gives an `Analysis` — the sharding-equivalence classes
(`DimClass`: dims that must be sharded alike), the conflicts (`Conflict`: a class on two dims of
one value, with its resolutions), each op's rule and the class of each of its factors. Repeated
layers can be grouped so one decision covers them all. `domains(an)` says which part of a
training step each value is in (compute, parameters, optimizer state), for per-domain plans.
`find_roles(an)` says what each class is for (the batch, the sequence, the residual width, what
tensor parallelism and FSDP split), read off the structure; class names and the expert
strategies both use it. `minor_classes(an)`: the classes with almost nothing at stake.
`layer_groups(an)` (`Analysis.layer_groups`): the parts of the forward pass a remat decision
covers (a scanned stack, unrolled repeated layers, a top-level scope). `micro_batching(an)`
(`Analysis.micro_batching`): whether the batch splits into micro-batches, and how, or why not.
"""

from ._analysis import Analysis, ToastWarning, UnknownPrimitiveError, analyze, minor_classes
from ._classes import MINOR_SHARE, NO_CLASS, REPLICATE, Conflict, ConflictSide, DimClass
from ._domains import (COMPUTE, DOMAINS, OPTIMIZER, PARAMETERS, Domains, crossing_reads,
                       domain_boundaries, domains)
from ._layer_groups import (BACKWARD, FORWARD, LAYERS, OUTSIDE, SCANNED, SCOPE, LayerGroup,
                            ad_pass, dot_without_batch_dims, layer_groups, passes)
from ._batch_kinds import AFTER, EXAMPLE, INDEPENDENT, SUM, ZERO
from ._micro_batching import MicroBatching, micro_batching
from ._roles import Roles, find_roles

__all__ = ["analyze", "Analysis", "DimClass", "Conflict", "ConflictSide", "REPLICATE",
           "NO_CLASS", "ToastWarning", "UnknownPrimitiveError", "domains", "crossing_reads",
           "domain_boundaries", "Domains", "DOMAINS",
           "COMPUTE", "PARAMETERS", "OPTIMIZER", "Roles", "find_roles", "minor_classes",
           "MINOR_SHARE", "LayerGroup", "layer_groups", "ad_pass", "passes", "FORWARD",
           "dot_without_batch_dims",
           "BACKWARD", "OUTSIDE", "SCANNED", "LAYERS", "SCOPE", "MicroBatching", "micro_batching",
           "INDEPENDENT", "ZERO", "EXAMPLE", "SUM", "AFTER"]
