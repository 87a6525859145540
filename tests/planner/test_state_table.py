"""The table of states in the docstring of :mod:`greyrelease.planner.machine` is :data:`HANDLERS` as it
is: a row for every (phase, batchState) key, naming the key's handler, and no row for a state that is not
a key."""

from __future__ import annotations

from greyrelease.api.release import BatchState, Phase
from greyrelease.planner import machine
from greyrelease.planner.machine import HANDLERS

Key = tuple[Phase | None, BatchState | None]


def _table() -> list[tuple[str, str, str]]:
    """The rows of the table (phase, batchState, handler) as written; a line that goes on with the row
    above (it starts in a later column) is not a row."""
    lines = (machine.__doc__ or "").splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:3] == ["phase", "batchState", "handler"])
    indent = len(lines[head]) - len(lines[head].lstrip())
    rows = []
    for line in lines[head + 1 :]:
        if not line.strip():
            break
        if len(line) - len(line.lstrip()) == indent:
            phase, state, handler = line.split()[:3]
            rows.append((phase, state, handler))
    return rows


def _key(phase: str, state: str) -> Key:
    return (
        None if phase == "(none)" else Phase(phase),
        None if state == "-" else BatchState(state),
    )


def test_every_row_names_a_state_of_the_machine_and_its_handler() -> None:
    rows = _table()
    phases, states = {p.value for p in Phase} | {"(none)"}, {s.value for s in BatchState} | {"-"}
    unknown = [(p, s) for p, s, _ in rows if p not in phases or s not in states or _key(p, s) not in HANDLERS]
    assert unknown == [], f"rows for states that are not keys of HANDLERS: {unknown}"
    wrong = [(p, s, h) for p, s, h in rows if HANDLERS[_key(p, s)].run.__name__ != h]
    assert wrong == [], f"rows naming another handler than HANDLERS has: {wrong}"


def test_every_state_of_the_machine_has_one_row() -> None:
    keys = [_key(p, s) for p, s, _ in _table()]
    assert len(keys) == len(set(keys)), "a state has two rows"
    missing = [key for key in HANDLERS if key not in keys]
    assert missing == [], f"states of HANDLERS without a row: {missing}"
