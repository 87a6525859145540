"""The pod network: pod IPs that answer, without giving the host any address it did not have.

KWOK gives pods addresses in the cluster's pod CIDR, but nothing listens there. Each local cluster claims a
*slot*: a /18 of 10.244.0.0/16 for its pods (KWOK's `--cidr`), a /30 link net in 10.245.0.0/16, and a
network namespace of its own. When the data plane starts, `PodNetwork.up()` creates that namespace, a veth
pair between it and the host (host side 10.245.N.1, namespace side 10.245.N.2), routes the slot's pod CIDR
from the host through the veth, and inside the namespace brings `lo` up and makes the whole pod CIDR local
(`ip route add local <cidr> dev lo`), so a server there can bind any pod IP. Requests from the host (the
proxy, Prometheus, a test) to a pod IP leave through the veth and reach only that namespace: nothing is
routed to the host's own interfaces, and nothing leaves the machine.

Slots are claimed with a file each (`$TMPDIR/greyrelease-podnet/slot-N`, holding the owner's pid), so two
clusters on one machine (two test runs at once) never share a pod CIDR or a route. A slot whose owner died
(a test run killed with SIGKILL) is taken over by the next claim, which first deletes the dead owner's
namespace; deleting a namespace deletes its veth pair, and the host's route through it goes with it.

A cluster that runs more pods at once than a slot has addresses claims two or four adjacent slots (a /17
or the whole /16; `units_for`), named after the first. It has to: KWOK hands out the address after the
last one it gave without checking that it is still in its `--cidr`, so the pods past a slot's 16,382nd
would get the next slot's addresses, and past the /16 the link nets' (10.245.0.0/16).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from e2e.harness.process import pid_alive

POD_SUPERNET = ipaddress.IPv4Network("10.244.0.0/16")
SLOT_PREFIX = 18  # 4 slots of 16,382 pod addresses each: N = 3,000 apps of 2 pods peak at 12,000 pods
SLOTS = 2 ** (SLOT_PREFIX - POD_SUPERNET.prefixlen)
SLOT_ADDRESSES = 2 ** (32 - SLOT_PREFIX) - 2  # KWOK gives neither the network's address nor the last one
NETNS_PREFIX = "greyrelease-pods-"


def units_for(pods: int) -> int:
    """How many adjacent slots (1, 2 or 4) hold the addresses of ``pods`` pods running at once."""
    units = 1
    while units * (SLOT_ADDRESSES + 2) - 2 < pods:
        units *= 2
        if units > SLOTS:
            raise ValueError(f"{pods} pods at once: more than the {POD_SUPERNET} pod network's addresses")
    return units


@dataclass(frozen=True)
class PodNetSlot:
    index: int
    #: Adjacent slots held together, from ``index`` on (1, 2 or 4; ``index`` a multiple of it): one CIDR.
    units: int = 1

    @property
    def pod_cidr(self) -> str:
        first = list(POD_SUPERNET.subnets(new_prefix=SLOT_PREFIX))[self.index]
        return str(first.supernet(new_prefix=SLOT_PREFIX - (self.units.bit_length() - 1)))

    @property
    def netns(self) -> str:
        return f"{NETNS_PREFIX}{self.index}"

    @property
    def host_veth(self) -> str:
        return f"grpods{self.index}"  # interface names have at most 15 characters

    @property
    def host_ip(self) -> str:
        return f"10.245.{self.index}.1"

    @property
    def netns_ip(self) -> str:
        return f"10.245.{self.index}.2"


def slots_dir() -> Path:
    return Path(tempfile.gettempdir()) / "greyrelease-podnet"


def _slot_owner(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _claim_one(index: int) -> bool:
    """Slot ``index`` recorded as this process's, when it is free or its owner is dead (cleaned first)."""
    path = slots_dir() / f"slot-{index}"
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = _slot_owner(path)
            if owner is None or pid_alive(owner):
                return False  # taken (or being written this instant)
            remove_netns(PodNetSlot(index).netns)
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as out:
            out.write(str(os.getpid()))
        return True
    return False


def claim_slot(units: int = 1) -> PodNetSlot:
    """The first ``units`` free adjacent slots (see :func:`units_for`), recorded as this process's; a slot
    whose owner is dead is cleaned and reused."""
    directory = slots_dir()
    directory.mkdir(parents=True, exist_ok=True)
    for index in range(0, SLOTS, units):
        claimed: list[int] = []
        for i in range(index, index + units):
            if not _claim_one(i):
                break
            claimed.append(i)
        if len(claimed) == units:
            return PodNetSlot(index, units)
        for i in claimed:
            (directory / f"slot-{i}").unlink(missing_ok=True)
    raise RuntimeError(
        f"no {units} adjacent pod network slot(s) of {SLOTS} in {directory} are free of running clusters; stop one"
    )


def release_slot(slot: PodNetSlot) -> None:
    for index in range(slot.index, slot.index + slot.units):
        path = slots_dir() / f"slot-{index}"
        if _slot_owner(path) == os.getpid():
            if index == slot.index:
                remove_netns(slot.netns)
            path.unlink(missing_ok=True)


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def remove_netns(name: str) -> None:
    if shutil.which("ip") is not None and netns_exists(name):
        _ip("netns", "delete", name, check=False)


def sweep_stale_netns() -> None:
    """Deletes our pod namespaces whose slot has no live owner (their cluster died without cleaning up),
    and the slot files of dead owners."""
    run_netns = Path("/run/netns")
    if run_netns.is_dir():
        for entry in run_netns.glob(f"{NETNS_PREFIX}*"):
            owner = _slot_owner(slots_dir() / f"slot-{entry.name[len(NETNS_PREFIX) :]}")
            if owner is None or not pid_alive(owner):
                remove_netns(entry.name)
    for path in slots_dir().glob("slot-*"):
        owner = _slot_owner(path)
        if owner is not None and not pid_alive(owner):
            path.unlink(missing_ok=True)


class PodNetwork:
    """The namespace, veth pair and routes of one slot (see the module's docstring)."""

    def __init__(self, slot: PodNetSlot) -> None:
        self.slot = slot

    @staticmethod
    def check_prerequisites() -> None:
        if os.geteuid() != 0:
            raise RuntimeError("the pod network needs root (it creates a network namespace and a veth pair)")
        if shutil.which("ip") is None:
            raise RuntimeError("the pod network needs the `ip` command (Debian package iproute2)")

    def up(self) -> None:
        self.check_prerequisites()
        s = self.slot
        remove_netns(s.netns)  # a leftover of this slot's previous owner
        _ip("link", "delete", s.host_veth, check=False)
        try:
            _ip("netns", "add", s.netns)
            _ip("link", "add", s.host_veth, "type", "veth", "peer", "name", "veth0", "netns", s.netns)
            _ip("addr", "add", f"{s.host_ip}/30", "dev", s.host_veth)
            _ip("link", "set", s.host_veth, "up")
            _ip("addr", "add", f"{s.netns_ip}/30", "dev", "veth0", netns=s.netns)
            _ip("link", "set", "veth0", "up", netns=s.netns)
            _ip("link", "set", "lo", "up", netns=s.netns)
            _ip("route", "add", "local", s.pod_cidr, "dev", "lo", netns=s.netns)
            _ip("route", "replace", s.pod_cidr, "via", s.netns_ip, "dev", s.host_veth)
        except BaseException:
            self.down()
            raise

    def down(self) -> None:
        # Deleting the veth pair takes the host's route through it along; the namespace itself goes once
        # the last process in it has exited.
        if shutil.which("ip") is not None:
            _ip("link", "delete", self.slot.host_veth, check=False)
        remove_netns(self.slot.netns)

    def exec_prefix(self) -> list[str]:
        """Prepended to a command to run it inside the namespace."""
        return ["ip", "netns", "exec", self.slot.netns]
