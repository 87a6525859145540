"""The lock files, and the container image that installs the runtime one.

`make lock` writes them with uv from pyproject.toml (settings in its [tool.uv.pip]), every pin exact and
with the sha256 of each of its files:

    requirements.txt        the runtime dependencies, transitively: what the Dockerfile installs
    requirements-test.txt   those at the same versions, and the `test` extra: what `make venv` installs
    requirements-bench.txt  the runtime and the `bench` extra at the test lock's versions (`make bench`)

These tests fail when a lock is stale against pyproject.toml (uv compiles it again, keeping the pins it
has, and comes to another set: run `make lock`), when a pin is loose or has no hash, and when the
environment the tests run in is not the one the locks describe.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.version import Version
from uv import find_uv_bin

ROOT = Path(__file__).resolve().parent.parent
# Each lock and what `make lock` passes to `uv pip compile pyproject.toml` for it, besides `-o <lock>`.
LOCKS = {
    "requirements.txt": [],
    "requirements-test.txt": ["--extra", "test", "-c", "requirements.txt"],
    "requirements-bench.txt": ["--extra", "bench", "-c", "requirements-test.txt"],
}
# pyproject.toml's dependency list that each lock must satisfy.
GROUPS = {"requirements.txt": None, "requirements-test.txt": "test", "requirements-bench.txt": "bench"}
# Put there by `python -m venv` (pip, and setuptools before Python 3.12), or the project itself, installed
# editable with --no-deps.
NOT_LOCKED = {"pip", "setuptools", "wheel", "greyrelease"}


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    marker: str  # "" when the pin holds everywhere
    hashes: tuple[str, ...]

    @property
    def applies(self) -> bool:
        """Whether the pin is for this interpreter and platform."""
        return not self.marker or Marker(self.marker).evaluate()

    @property
    def pinned(self) -> tuple[str, str, str]:
        return (self.name, self.version, self.marker)


def parse_lock(text: str) -> list[Pin]:
    pins = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        hashes = tuple(re.findall(r"--hash=(\S+)", line))
        req = Requirement(re.sub(r"--hash=\S+", "", line).strip())
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"not an exact pin: {line}"
        pins.append(Pin(_key(req.name), specs[0].version, str(req.marker or ""), hashes))
    return pins


def read_lock(name: str) -> list[Pin]:
    return parse_lock((ROOT / name).read_text())


def versions(pins: list[Pin]) -> dict[str, str]:
    """{name: version} of the pins for this interpreter and platform."""
    return {pin.name: pin.version for pin in pins if pin.applies}


def installed() -> dict[str, str]:
    """{normalized name: version} of every distribution this interpreter imports from."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        found.setdefault(_key(dist.metadata["Name"]), dist.version)
    return found


def runtime_closure(root: str = "greyrelease") -> dict[str, str]:
    """{normalized name: installed version} of every runtime dependency of ``root``, transitively."""
    pins: dict[str, str] = {}
    todo = [root]
    while todo:
        for raw in metadata.distribution(todo.pop()).requires or []:
            req = Requirement(raw)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue  # extras (test, bench) and other platforms
            if _key(req.name) not in pins:
                pins[_key(req.name)] = metadata.version(req.name)
                todo.append(req.name)
    return pins


@pytest.mark.parametrize("lock", LOCKS)
def test_every_pin_is_exact_and_hashed(lock: str) -> None:
    text = (ROOT / lock).read_text()
    assert "#    make lock\n" in text, f"{lock} was not written by `make lock`"
    pins = parse_lock(text)
    assert pins, f"{lock} pins nothing"
    assert [pin.name for pin in pins if not pin.hashes] == [], f"pins without a hash in {lock}"
    assert all(h.startswith("sha256:") for pin in pins for h in pin.hashes)


@pytest.mark.parametrize("lock", LOCKS)
def test_every_dependency_of_pyproject_is_pinned_within_its_range(lock: str) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    group = GROUPS[lock]
    wanted = project["dependencies"] + (project["optional-dependencies"][group] if group else [])
    pins = versions(read_lock(lock))
    for raw in wanted:
        req = Requirement(raw)
        assert _key(req.name) in pins, f"{req.name} is not pinned in {lock}"
        assert Version(pins[_key(req.name)]) in req.specifier, f"{req.name}=={pins[_key(req.name)]} not in {req}"


def test_the_locks_agree_where_they_overlap() -> None:
    runtime, test, bench = (versions(read_lock(lock)) for lock in LOCKS)
    assert {name: test.get(name) for name in runtime} == runtime, "requirements-test.txt moved a runtime pin"
    shared = bench.keys() & test.keys()
    assert {name: bench[name] for name in shared} == {name: test[name] for name in shared}, (
        "requirements-bench.txt and requirements-test.txt pin a package at different versions"
    )


@pytest.mark.parametrize("lock", LOCKS)
def test_the_lock_is_current_with_pyproject(lock: str, tmp_path: Path) -> None:
    """uv compiles the lock again from pyproject.toml, starting from its pins: the same set, or it is stale."""
    again = tmp_path / lock
    shutil.copy(ROOT / lock, again)  # uv keeps the pins of the file it writes over while they still fit
    done = subprocess.run(
        [find_uv_bin(), "pip", "compile", "--quiet", "pyproject.toml", *LOCKS[lock], "-o", str(again)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (
        f"uv pip compile failed (pyproject.toml cannot be met, or the package index is out of reach):\n{done.stderr}"
    )
    old = {pin.pinned for pin in read_lock(lock)}
    new = {pin.pinned for pin in parse_lock(again.read_text())}
    assert old == new, (
        f"{lock} is stale against pyproject.toml, run `make lock`:\n"
        f"  only in {lock}: {sorted(old - new)}\n  only in a fresh compile: {sorted(new - old)}"
    )


def test_the_runtime_lock_is_the_installed_runtime_closure() -> None:
    """The image installs requirements.txt: exactly the project's runtime closure, as the tests run it."""
    assert versions(read_lock("requirements.txt")) == runtime_closure(), (
        "requirements.txt is not the runtime closure installed here: run `make lock`, then `make venv`"
    )


def test_the_environment_is_the_lock() -> None:
    """Every pin of the test lock is installed at its version; nothing else is, but the benchmarks' lock."""
    here = installed()
    test = versions(read_lock("requirements-test.txt"))
    allowed = {**versions(read_lock("requirements-bench.txt")), **test}
    missing_or_moved = {name: (version, here.get(name)) for name, version in test.items() if here.get(name) != version}
    assert missing_or_moved == {}, f"(locked, installed) differ, run `make venv`: {missing_or_moved}"
    unlocked = {
        name: version for name, version in here.items() if name not in NOT_LOCKED and allowed.get(name) != version
    }
    assert unlocked == {}, f"installed but not at a locked version, run `make clean venv`: {unlocked}"
