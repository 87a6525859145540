"""The Argo CD health check of a GreyRelease (config/gitops/argocd/health.lua) run on a table of objects,
with Lua 5.1 (the language of gopher-lua, which Argo CD embeds) and Lua 5.4, in an environment like Argo
CD's: only the base and table libraries and a safe ``os``, strings without methods (no string library)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from greyrelease.api.release import Phase

from tests.gitops.conftest import GITOPS

HEALTH = GITOPS / "argocd" / "health.lua"
INTERPRETERS = ("lua5.1", "lua5.4")

#: Runs the script at arg[1] on the object whose Lua literal is in the file arg[2]; prints status, message.
RUNNER = r"""
local function read(path)
  local f = assert(io.open(path))
  local text = f:read("*a")
  f:close()
  return text
end
local obj = assert((loadstring or load)("return " .. read(arg[2])))()
local env = {obj = obj, table = table, os = {time = os.time, date = os.date}}
for _, name in ipairs({"assert", "error", "getmetatable", "ipairs", "next", "pairs", "pcall", "print",
    "rawequal", "rawget", "rawset", "select", "setmetatable", "tonumber", "tostring", "type", "unpack",
    "xpcall"}) do
  env[name] = _G[name]
end
local source = read(arg[1])
getmetatable("").__index = nil
local chunk
if setfenv then
  chunk = assert(loadstring(source, "=health.lua"))
  setfenv(chunk, env)
else
  chunk = assert(load(source, "=health.lua", "t", env))
end
local hs = chunk()
io.write(tostring(hs.status), "\n", tostring(hs.message), "\n")
"""

#: Every phase's health (the release's message follows the phase in the health's message).
PHASES = {
    "Initializing": "Progressing",
    "Waiting": "Progressing",
    "Queued": "Progressing",
    "Progressing": "Progressing",
    "Paused": "Suspended",
    "Promoting": "Progressing",
    "Succeeded": "Healthy",
    "RollingBack": "Degraded",
    "Aborted": "Degraded",
    "Failed": "Degraded",
    "InvalidSpec": "Degraded",
    "Idle": "Healthy",
}


def lua(value: Any) -> str:
    """``value`` (as decoded from JSON) as a Lua literal, as Argo CD hands the object to the script."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # the escapes of ASCII strings are Lua's too
    if isinstance(value, list):
        return "{" + ", ".join(lua(v) for v in value) + "}"
    return "{" + ", ".join(f"[{lua(k)}] = {lua(v)}" for k, v in value.items()) + "}"


def release(
    phase: str | None = None,
    *,
    message: str = "",
    generation: int = 3,
    observed: int | None = 3,
    conditions: dict[str, tuple[str, str]] | None = None,
    **status: Any,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "greyrelease.io/v1",
        "kind": "GreyRelease",
        "metadata": {"name": "web", "namespace": "shop", "generation": generation},
        "spec": {"targetRef": {"kind": "Deployment", "name": "web"}},
    }
    if phase is not None:
        obj["status"] = {"phase": phase, "message": message, **status}
        if observed is not None:
            obj["status"]["observedGeneration"] = observed
        if conditions is not None:
            obj["status"]["conditions"] = [
                {"type": t, "status": s, "reason": phase, "message": m} for t, (s, m) in conditions.items()
            ]
    return obj


def health(interpreter: str, obj: dict[str, Any], tmp_path: Path, commands: dict[str, str]) -> tuple[str, str]:
    runner, case = tmp_path / "runner.lua", tmp_path / "case.lua"
    runner.write_text(RUNNER)
    case.write_text(lua(obj))
    proc = subprocess.run(
        [commands[interpreter], str(runner), str(HEALTH), str(case)], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, f"{interpreter}: {proc.stderr}"
    status, message = proc.stdout.split("\n")[:2]
    return status, message


def test_every_phase_has_a_health() -> None:
    assert {p.value for p in Phase} <= set(PHASES), "a phase health.lua does not map: add it there and here"


@pytest.mark.parametrize("interpreter", INTERPRETERS)
@pytest.mark.parametrize("phase", sorted(PHASES))
def test_each_phase(interpreter: str, phase: str, tmp_path: Path, commands: dict[str, str]) -> None:
    obj = release(phase, message="what the release does")
    assert health(interpreter, obj, tmp_path, commands) == (PHASES[phase], f"{phase}: what the release does")


CASES: dict[str, tuple[dict[str, Any], tuple[str, str]]] = {
    "no status yet": (release(), ("Progressing", "Waiting for the controller")),
    "an empty status": ({**release(), "status": {}}, ("Progressing", "Waiting for the controller")),
    "a generation not seen yet": (
        release("Succeeded", generation=4, observed=3),
        ("Progressing", "Waiting for the controller to see generation 4"),
    ),
    "no observedGeneration": (
        release("Succeeded", generation=1, observed=None),
        ("Progressing", "Waiting for the controller to see generation 1"),
    ),
    "being deleted": (
        {**release("Progressing"), "metadata": {**release()["metadata"], "deletionTimestamp": "2026-12-06T10:00:00Z"}},
        ("Progressing", "Being deleted: the Deployment is put back as it was before the release"),
    ),
    "a batch waiting for approval": (
        release("Progressing", message="batch 3/4 waiting for approval", batchState="WaitingForApproval"),
        ("Suspended", "Progressing: batch 3/4 waiting for approval"),
    ),
    "a batch under way": (
        release("Progressing", message="batch 2/4 live", batchState="Verifying"),
        ("Progressing", "Progressing: batch 2/4 live"),
    ),
    "no message": (release("Succeeded"), ("Healthy", "Succeeded")),
    "a phase it does not know": (release("Exploded"), ("Unknown", "Exploded: unknown phase 'Exploded'")),
    "the conditions of today's status do not change a phase's health": (
        release("Failed", message="gate", conditions={"Healthy": ("False", "gate"), "Completed": ("True", "gate")}),
        ("Degraded", "Failed: gate"),
    ),
    "Stalled": (
        release("Aborted", message="m", conditions={"Ready": ("False", "r"), "Stalled": ("True", "held on v1")}),
        ("Degraded", "Aborted: held on v1"),
    ),
    "Stalled without a message": (
        release("Failed", message="the release's", conditions={"Stalled": ("True", "")}),
        ("Degraded", "Failed: the release's"),
    ),
    "Reconciling": (
        release("Progressing", message="m", conditions={"Ready": ("False", ""), "Reconciling": ("True", "batch 1")}),
        ("Progressing", "Progressing: batch 1"),
    ),
    "Reconciling while paused: a person has to act": (
        release("Paused", message="paused", conditions={"Reconciling": ("True", "batch 2")}),
        ("Suspended", "Paused: paused"),
    ),
    "Ready": (
        release("Idle", message="runs web:v1", conditions={"Ready": ("True", ""), "Reconciling": ("False", "")}),
        ("Healthy", "Idle: runs web:v1"),
    ),
    "Ready=False alone": (
        release("Succeeded", message="m", conditions={"Ready": ("False", "a template is held")}),
        ("Progressing", "Succeeded: a template is held"),
    ),
}


@pytest.mark.parametrize("interpreter", INTERPRETERS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_cases(interpreter: str, case: str, tmp_path: Path, commands: dict[str, str]) -> None:
    obj, expected = CASES[case]
    assert health(interpreter, obj, tmp_path, commands) == expected


def test_the_argocd_cm_patch_carries_the_same_script() -> None:
    cm = yaml.safe_load((GITOPS / "argocd" / "argocd-cm.yaml").read_text())
    assert (cm["kind"], cm["metadata"]["name"]) == ("ConfigMap", "argocd-cm")
    assert cm["data"]["resource.customizations.health.greyrelease.io_GreyRelease"] == HEALTH.read_text(), (
        "config/gitops/argocd/argocd-cm.yaml and health.lua differ: change both"
    )
