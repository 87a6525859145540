"""Process supervision for the local test environment: where things live, free ports, components as
processes of their own (killed with their parent), and work directories swept when their owner died."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

K8S_VERSION = "1.37.2"
HERE = Path(__file__).resolve().parent.parent  # the e2e directory
T = TypeVar("T")


# --- locations -------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    return Path(os.environ.get("GREYRELEASE_CACHE") or Path.home() / ".cache" / "greyrelease")


def bin_dir() -> Path:
    """Where build.sh puts the binaries; GREYRELEASE_BIN_DIR overrides."""
    override = os.environ.get("GREYRELEASE_BIN_DIR")
    return Path(override) if override else cache_dir() / f"k8s-v{K8S_VERSION}" / "bin"


def run_dir() -> Path:
    """State of the background cluster started by `python -m e2e.cluster up`."""
    return cache_dir() / "run"


# --- small utilities ---------------------------------------------------------------------------------------


def reserve_ports(n: int) -> list[socket.socket]:
    """`n` sockets bound to distinct free loopback ports. A port stays taken for as long as its socket is
    open: close it just before starting the process that listens on it."""
    held: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(s)
            s.bind(("127.0.0.1", 0))
    except BaseException:
        for s in held:
            s.close()
        raise
    return held


def free_ports(n: int) -> list[int]:
    """`n` distinct free loopback ports (all picked while the others are still held)."""
    held = reserve_ports(n)
    ports = [int(s.getsockname()[1]) for s in held]
    for s in held:
        s.close()
    return ports


def free_port() -> int:
    return free_ports(1)[0]


_ERROR_LINE = re.compile(r"error|fail|fatal|panic|address already in use", re.IGNORECASE)


class ProcessDied(RuntimeError):
    """A component exited: waiting longer cannot help."""

    def __init__(self, name: str, code: int | None, log: str, tail_lines: int = 25) -> None:
        lines = log.splitlines()
        errors = [line for line in lines if _ERROR_LINE.search(line)][-15:]
        message = f"{name} exited ({code})"
        if errors:
            message += ";\nerror lines:\n" + "\n".join(errors)
        message += ";\nlast log lines:\n" + ("\n".join(lines[-tail_lines:]) or "(empty log)")
        super().__init__(message)
        self.name = name
        # Another process took the port between picking it and the component binding it.
        self.port_in_use = "address already in use" in log


def wait_until(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.1) -> T:
    """Calls `check` until it returns something truthy (returned) or `timeout` seconds pass. Exceptions
    count as "not yet", except ProcessDied."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = check()
            if result:
                return result
        except ProcessDied:
            raise
        except Exception as exc:  # the last error goes into the timeout message
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


# --- processes ---------------------------------------------------------------------------------------------


def die_with_parent() -> None:
    """Runs in the child before exec: ask Linux to kill it when its parent dies, so a killed test run or
    supervisor leaves no process behind. SIGKILL, not SIGTERM: all components get the signal at once, and
    a kube-apiserver shutting down gracefully while etcd is gone hangs indefinitely."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass
class Process:
    name: str
    args: list[str]
    log: Path
    cwd: Path | None = None
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            # Own process group: stop() can signal the component and anything it spawned, and a Ctrl-C in
            # the terminal reaches the test runner (which shuts down in order) rather than every component.
            self.popen = subprocess.Popen(
                self.args,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=die_with_parent,
            )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            code = self.popen.returncode if self.popen else None
            raise ProcessDied(self.name, code, self.read_log())

    def read_log(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"

    def tail(self, lines: int = 25) -> str:
        return "\n".join(self.read_log().splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.popen.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


# --- work directories ------------------------------------------------------------------------------------


OWNER_FILE = "owner.pid"
TEMP_PREFIXES = ("greyrelease-cluster-", "greyrelease-prometheus-", "greyrelease-dataplane-")


def claim_workdir(workdir: Path) -> Path:
    """Records this process as the owner of `workdir`, for sweep_stale_workdirs()."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / OWNER_FILE).write_text(str(os.getpid()))
    return workdir


def new_workdir(prefix: str) -> Path:
    return claim_workdir(Path(tempfile.mkdtemp(prefix=prefix)))


def sweep_stale_workdirs() -> None:
    """Removes temporary work directories whose owner died without cleaning up (e.g. a test run killed
    with SIGKILL; its processes died with it, see die_with_parent)."""
    for prefix in TEMP_PREFIXES:
        for workdir in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
            try:
                owner = int((workdir / OWNER_FILE).read_text())
            except (OSError, ValueError):
                continue  # not ours, or just being created
            if not pid_alive(owner):
                shutil.rmtree(workdir, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
