"""Stages 4, 5 and 8 (DESIGN.md): the mesh and its devices, the plan, and its export.

- `Mesh` (named axes over devices of one kind) and the device presets (`devices()`,
  `get_device`, `DeviceSpec`, `Link`): what a plan is for.
- `Plan`: an immutable mapping class -> mesh axes plus each conflict's resolution, for one
  Analysis; from it every value gets a PartitionSpec. `random_plan` draws valid ones.
- export: NamedSharding pytrees, sharding constraints, `plan.jit`, logical-axis rules, and the
  versioned JSON plan file (`plan.save`, `Plan.load`), which never executes code when read.
- files: `write_file` writes every file toast-lab writes for a person atomically, and refuses
  (`ExistingFileError`) to replace one that is not of its kind unless asked (`replace_refusal`
  says so beforehand); `write_plan_file` writes a plan file's document (the Lab adds its view
  to it), replacing only plan files (`is_plan_file`) unless asked.
- display: what a plan looks like (its view model, estimate, expert rows) for plan files and
  `display(plan)`, built by whatever the Lab registers with `register_display` (stage 10 sits
  above this one, so it plugs in rather than being imported).
- decisions beyond sharding: `StepDecisions` (a remat policy per layer group, the micro-batch
  count; `Plan.step`), which `plan.jit` applies by rewriting the traced step
  (`remat_rewrite` says what each group recomputes, and `rewritten_step` is the rewritten
  step itself, each op under the named scope OP_SCOPE<op id>, for the cost model to price);
- for the later stages' entry points: `check_analysis` and `check_mesh` (the one check of an
  analysis or mesh argument, with an error that says what to pass), `override_name` (the class
  and domain of an override named "<class>@<domain>") and `echo` (the shortened repr with
  which errors quote what a user gave).
"""

from ._decisions import (MICRO_BATCHES, PIPELINE_PREFIX, REMAT_POLICIES, REMAT_PREFIX,
                         StepDecisions, parse_pipeline)
from ._display import PLAN_MIME, PlanDisplay, register_display
from ._export import CONSTRAINT_POLICIES, donated_arguments, spec_of
from ._files import ExistingFileError, replace_refusal, write_file
from ._hardware import DeviceSpec, Efficiency, Link, devices, get_device
from ._mesh import Mesh, check_mesh
from ._plan import Axes, Plan, PlanError, check_analysis, override_name
from ._pipeline import (CIRCULAR, GPIPE, MICRO_BATCHES_PER_STAGE, STAGE_SCOPE, Pipeline,
                        PipelineRefused, StackPipeline, stack_pipeline)
from ._planfile import PLAN_FILE, PlanFileError, echo, is_plan_file, write as write_plan_file
from ._random_plan import random_plan
from ._remat import RematRewrite, ScanRemat, UnitRemat, remat_rewrite
from ._step_replay import OP_SCOPE, rewritten_step
from ._units import format_bytes

__all__ = ["Mesh", "DeviceSpec", "Efficiency", "Link", "devices", "get_device", "Plan",
           "PlanError", "PlanFileError", "Axes", "random_plan", "spec_of", "CONSTRAINT_POLICIES",
           "donated_arguments", "format_bytes", "PlanDisplay", "register_display", "PLAN_MIME",
           "ExistingFileError", "write_file", "replace_refusal", "write_plan_file", "is_plan_file",
           "PLAN_FILE", "check_analysis", "check_mesh", "override_name", "echo", "StepDecisions",
           "REMAT_POLICIES", "REMAT_PREFIX", "MICRO_BATCHES", "remat_rewrite", "RematRewrite",
           "UnitRemat",
           "ScanRemat", "rewritten_step", "OP_SCOPE", "Pipeline", "PipelineRefused",
           "StackPipeline", "stack_pipeline", "PIPELINE_PREFIX", "STAGE_SCOPE",
           "MICRO_BATCHES_PER_STAGE", "GPIPE", "CIRCULAR", "parse_pipeline"]
