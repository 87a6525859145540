"""The tests of what ships for Argo CD and Flux (config/gitops/) run the shipped Lua and jq expressions with
the interpreters of Debian's packages, installed here when missing, as the Makefile installs Prometheus:
lua5.1 (the Lua that Argo CD's gopher-lua implements), lua5.4 (today's), and jq."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GITOPS = ROOT / "config" / "gitops"

#: command -> the Debian package that has it
COMMANDS = {"lua5.1": "lua5.1", "lua5.4": "lua5.4", "jq": "jq"}


@pytest.fixture(scope="session")
def commands() -> dict[str, str]:
    """The path of each of COMMANDS, after one ``apt-get install`` of the packages missing (root, Debian)."""
    missing = sorted({package for command, package in COMMANDS.items() if shutil.which(command) is None})
    if missing:
        if shutil.which("apt-get") is None:
            pytest.skip(f"{', '.join(missing)} missing, and no apt-get to install them")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]
        for step in (["apt-get", "update", "-qq"], install):
            proc = subprocess.run(step, capture_output=True, text=True, env=env, timeout=600)
            if proc.returncode != 0:
                pytest.fail(f"{' '.join(step)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    paths = {command: shutil.which(command) for command in COMMANDS}
    absent = [command for command, path in paths.items() if path is None]
    if absent:
        pytest.fail(f"still not on PATH after installing their packages: {', '.join(absent)}")
    return {command: str(path) for command, path in paths.items()}
