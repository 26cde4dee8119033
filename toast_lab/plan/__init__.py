"""Stages 4, 5 and 8 (DESIGN.md): the mesh and its devices, the plan, and its export.

- `Mesh` (named axes over devices of one kind) and the device presets (`devices()`,
  `get_device`, `DeviceSpec`, `Link`): what a plan is for.
- `Plan`: an immutable mapping class -> mesh axes plus each conflict's resolution, for one
  Analysis; from it every value gets a PartitionSpec. `random_plan` draws valid ones.
- export: NamedSharding pytrees, sharding constraints, `plan.jit`, logical-axis rules, and the
  versioned JSON plan file (`plan.save`, `Plan.load`), which never executes code when read.
- display: what a plan looks like (its view model, estimate, expert rows) for plan files and
  `display(plan)`, built by whatever the Lab registers with `register_display` (stage 10 sits
  above this one, so it plugs in rather than being imported).
"""

from ._display import PLAN_MIME, PlanDisplay, register_display
from ._export import CONSTRAINT_POLICIES, donated_arguments, spec_of
from ._hardware import DeviceSpec, Efficiency, Link, devices, get_device
from ._mesh import Mesh
from ._plan import Axes, Plan, PlanError
from ._planfile import PlanFileError
from ._random_plan import random_plan
from ._units import format_bytes

__all__ = ["Mesh", "DeviceSpec", "Efficiency", "Link", "devices", "get_device", "Plan",
           "PlanError", "PlanFileError", "Axes", "random_plan", "spec_of", "CONSTRAINT_POLICIES",
           "donated_arguments", "format_bytes", "PlanDisplay", "register_display", "PLAN_MIME"]
