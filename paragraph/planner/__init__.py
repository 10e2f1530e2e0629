"""The planner: every decision made by measurement, one module each.

* `compile` (`compile.py`): the one compile path, import -> search -> build -> plan, with
  `CompileOptions`;
* `Session` (`session.py`): what the decisions of one compile share (target, cost database,
  tuning database, cores, log, and the `Meter` that times programs, here or remote);
* `plan_schedule` (`schedules.py`): a schedule by name: the graph algorithms as they are,
  critical-path (`critical_path.py`) and IOS (`ios.py`) by measurement;
* `search_plan` (`onboard.py`): the substitution search with AutoGraph's on-board loop;
* `check_models` (`model_check.py`): which tuned kernels to apply, by whole runs;
* `Plan` and its typed report (`plan.py`).
"""

from paragraph.planner.compile import CompileOptions, compile
from paragraph.planner.critical_path import plan_critical_path, plan_like, split_program
from paragraph.planner.ios import plan_ios
from paragraph.planner.model_check import ModelCheck, check_models, tune_and_check
from paragraph.planner.onboard import (
    MAX_OVERSHOOT,
    candidates_in_memory,
    measure_signatures,
    required_gain,
    search_plan,
    worth_building,
)
from paragraph.planner.plan import (
    CriticalPathReport,
    IOSConfirmation,
    IOSReport,
    Plan,
    PlanReport,
    RewriteChoice,
    SearchReport,
    StreamsChoice,
)
from paragraph.planner.schedules import SCHEDULES, check_schedule, plan_schedule
from paragraph.planner.session import Session

__all__ = ["CompileOptions", "compile", "Session", "SCHEDULES", "check_schedule",
           "plan_schedule", "plan_critical_path", "plan_like", "split_program", "plan_ios",
           "search_plan", "measure_signatures", "required_gain", "worth_building",
           "candidates_in_memory", "MAX_OVERSHOOT", "check_models", "tune_and_check",
           "ModelCheck", "Plan", "PlanReport", "CriticalPathReport", "StreamsChoice",
           "RewriteChoice", "IOSReport", "IOSConfirmation", "SearchReport"]
