"""The decision core, pure: :func:`decide` turns a release's spec, its recorded status and what the
cluster looks like now (:class:`Observed`) into a :class:`Plan` (actions, the new status, Events, when to
look again). Nothing here reads a clock, a file or the network; the import contract in pyproject.toml
keeps it so. The state machine and its table are :mod:`.machine`; its handlers are split by concern
(see its docstring)."""

from greyrelease.planner.actions import Action, Event, Plan
from greyrelease.planner.machine import Observed, Workload, aborting, decide, progressing, started

__all__ = ["Action", "Event", "Observed", "Plan", "Workload", "aborting", "decide", "progressing", "started"]
