"""End-to-end: three replicas run with ``--shards 3`` over six namespaces (two per shard), 30 releases; one
replica is SIGKILLed mid-way, or cut off (SIGSTOP) for longer than its Leases and then let go on (SIGCONT); or two
replicas join one that holds every shard, mid-release.
The releases of its shard go on under another replica, every release completes once (history and Events),
and the audit log shows that every write of a release came from the replica holding its shard's Lease at
that moment, within the Lease's duration of its last renewal."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from greyrelease.runtime.shards import shard_of

from e2e.harness.controller import Controller, apply_release, drop_releases, gr, status, wait_for
from e2e.harness.controlplane import Cluster, LocalCluster
from e2e.harness.reliability import audited_writes, batch_ready_counts, deploy_apps, now, release_events

pytestmark = pytest.mark.e2e

SHARDS = 3
LEASE = 15  # --lease-seconds, the default
PER_NAMESPACE = 5
TERMINAL = {"Succeeded", "Failed", "Aborted"}
#: Batch 2's pause is the window in which a replica is lost: long enough that the status poll, which starts once
#: the last release is applied and asks through kubectl on a loaded machine, sees that release in it.
BATCHES = [{"replicas": 1, "pause": "4s"}, {"replicas": 2, "pause": "8s"}, {"replicas": 3}]


def spread_namespaces(token: str, per_shard: int = 2) -> list[str]:
    """Namespace names, ``per_shard`` in each shard (the hash decides; names are tried in turn)."""
    picked: dict[int, list[str]] = {k: [] for k in range(SHARDS)}
    i = 0
    while any(len(v) < per_shard for v in picked.values()):
        name = f"e2e-shards-{token}-{i}"
        k = shard_of(name, SHARDS)
        if len(picked[k]) < per_shard:
            picked[k].append(name)
        i += 1
    return [ns for k in range(SHARDS) for ns in picked[k]]


@pytest.fixture
def spread(cluster: Cluster, crd: Path) -> Iterator[tuple[list[str], str]]:
    if not isinstance(cluster, LocalCluster):
        pytest.skip("needs the local cluster's API server (sharded watches on, the audit log)")
    token = os.urandom(3).hex()
    namespaces, system = spread_namespaces(token), f"e2e-shards-{token}-system"
    for ns in [*namespaces, system]:
        cluster.kubectl("create", "namespace", ns)
        cluster.wait_for_namespace_ready(ns)
    try:
        yield namespaces, system
    finally:
        for ns in namespaces:
            drop_releases(cluster, ns)
        for ns in [*namespaces, system]:
            cluster.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def holding(replica: Controller) -> set[int]:
    """The shards the replica's log says it holds now."""
    held: set[int] = set()
    for line in replica.log.read_text(errors="replace").splitlines() if replica.log.exists() else []:
        if m := re.search(r"holding shard (\d+) of", line):
            held.add(int(m.group(1)))
        elif m := re.search(r"shard (\d+) stopped", line):
            held.discard(int(m.group(1)))
    return held


def replica(cluster: Cluster, namespaces: list[str], system: str, logs: Path, i: int) -> Controller:
    return Controller(
        cluster,
        namespaces,
        logs / f"replica-{i}.log",
        extra_args=["--shards", str(SHARDS), "--leader-election-namespace", system],
    )


def start_replicas(cluster: Cluster, namespaces: list[str], system: str, logs: Path) -> list[Controller]:
    replicas = [replica(cluster, namespaces, system, logs, i) for i in range(SHARDS)]
    for r in replicas:
        r.start()
    wait_for(lambda: all(len(holding(r)) == 1 for r in replicas), 60, "each replica holding one shard", 0.5)
    assert set().union(*(holding(r) for r in replicas)) == set(range(SHARDS))
    return replicas


def start_releases(cluster: Cluster, namespaces: list[str]) -> list[tuple[str, str]]:
    releases = [(ns, f"app-{i}") for ns in namespaces for i in range(PER_NAMESPACE)]
    for ns in namespaces:
        deploy_apps(cluster, ns, {name: 3 for n, name in releases if n == ns})
    for ns, name in releases:
        apply_release(
            cluster,
            ns,
            gr(
                name,
                targetRef={"name": name},
                targetVersion="v2",
                batches=BATCHES,
                trafficRouting={"service": {"name": name}},
            ),
        )
    return releases


def check_completed_once(cluster: Cluster, releases: list[tuple[str, str]], timeout: float = 240) -> list[str]:
    """Waits for every release to end; what is wrong with any (phase, history, Events)."""

    def done() -> bool:
        return all(status(cluster, ns, name).get("phase") in TERMINAL for ns, name in releases)

    wait_for(done, timeout, f"{len(releases)} releases ended", 1.0)
    problems = []
    events = {ns: release_events(cluster, ns) for ns in {ns for ns, _ in releases}}
    for ns, name in releases:
        st = status(cluster, ns, name)
        history = [h["batch"] for h in st.get("history") or []]
        mine = events[ns].get(name, Counter())
        if st.get("phase") != "Succeeded" or history != [1, 2, 3]:
            problems.append(f"{ns}/{name}: {st.get('phase')} ({st.get('message')}), history {history}")
        if batch_ready_counts(mine) != {1: 1, 2: 1, 3: 1}:
            problems.append(f"{ns}/{name}: BatchReady Events per batch {batch_ready_counts(mine)}")
        if twice := {k: v for k, v in mine.items() if v > 1}:
            problems.append(f"{ns}/{name}: Events posted more than once: {twice}")
    return problems


#: The controller's client gives up on a request after this many seconds (greyrelease.kube.client).
CLIENT_TIMEOUT = 15.0


@dataclass(frozen=True)
class Lost:
    """The replica lost, and when (the test's clock, which is the API server's: one machine): SIGKILLed or
    SIGSTOPped at ``since``, let go on (SIGCONT) at ``until`` (never, when killed)."""

    pid: int
    since: datetime
    until: datetime | None = None

    def owns(self, identity: str) -> bool:
        """Whether ``identity`` (the holder's name in a Lease and its user agent: host, pid, a random part) is
        the lost replica's."""
        return identity.rsplit("-", 2)[-2:-1] == [str(self.pid)]

    def in_flight(self, received: datetime) -> bool:
        """A write of the lost replica the API server received while the replica was dead or frozen: it can
        only have been sent before (when the replica held its shard, which the check of the writes sent
        after shows), and it was received within the client's timeout of that."""
        return (
            self.since
            <= received
            <= min(self.until or datetime.max.replace(tzinfo=UTC), self.since + timedelta(seconds=CLIENT_TIMEOUT))
        )


def writes_outside_tenure(
    cluster: LocalCluster, namespaces: list[str], system: str, since: datetime, lost: Lost
) -> tuple[int, list[str], list[str]]:
    """Every write of the replicas in the release namespaces, checked against the shard Leases' history in
    the audit log: it must come from the replica that last wrote its shard's Lease (taken or renewed), less
    than the Lease's duration after that write. The number of writes checked, the ones that fail, and the
    writes the lost replica had sent before it was lost that the API server received after (in flight: no
    Lease fences a request already on the wire; the replica's own check stops sending 2 s before its Lease
    can be taken, and an API server slow to read a request can take longer than that)."""
    timeline: dict[int, list[tuple[datetime, str]]] = {k: [] for k in range(SHARDS)}
    for w in audited_writes(cluster, namespace=system, agents=("greyrelease/",), since=since):
        m = re.fullmatch(rf"greyrelease-shard-(\d+)-of-{SHARDS}", w.name)
        if w.resource == "leases" and m and 200 <= w.code < 300:
            holder = ((w.body or {}).get("spec") or {}).get("holderIdentity") or ""
            timeline[int(m.group(1))].append((w.at, holder))
    checked, problems, in_flight = 0, [], []
    for ns in namespaces:
        k = shard_of(ns, SHARDS)
        for w in audited_writes(cluster, namespace=ns, agents=("greyrelease/",), since=since):
            checked += 1
            me = w.agent.split("/", 1)[1].split(" ")[0]
            before = [(at, holder) for at, holder in timeline[k] if at <= w.at]
            if before and before[-1][1] != me and lost.owns(me) and lost.in_flight(w.at):
                in_flight.append(f"{w} by {me}, received while it was lost (since {lost.since})")
            elif not before:
                problems.append(f"{w} by {me}: shard {k}'s Lease never held before it")
            elif before[-1][1] != me:
                problems.append(f"{w} by {me}: shard {k}'s Lease held by {before[-1][1]!r} since {before[-1][0]}")
            elif (w.at - before[-1][0]).total_seconds() >= LEASE:
                problems.append(f"{w} by {me}: shard {k}'s Lease last renewed at {before[-1][0]}")
    return checked, problems, in_flight


def stuck(cluster: Cluster, namespace: str, name: str, replicas: list[Controller]) -> str:
    """What a release that did not move had: its status, its Deployments, the namespace's Events and the
    replicas' logs."""
    deployments = cluster.kubectl(
        "get", "deployments", "-n", namespace, "-o", "wide", "--show-labels", check=False
    ).stdout
    seen = cluster.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False).stdout
    logs = "\n".join(f"--- {r.log.name} ---\n{r.logs()}" for r in replicas)
    return f"{namespace}/{name}: {json.dumps(status(cluster, namespace, name))}\n{deployments}\n{seen[-4000:]}\n{logs}"


def stop_all(replicas: list[Controller]) -> None:
    """SIGTERM to all at once (one by one, each would hand its shards to the next, which would start them)."""
    for r in replicas:
        r.signal(signal.SIGTERM)
    for r in replicas:
        r.stop()


def victim_of(replicas: list[Controller], namespace: str) -> tuple[Controller, int]:
    """The replica holding the shard of ``namespace``, and that shard."""
    k = shard_of(namespace, SHARDS)
    return next(r for r in replicas if k in holding(r)), k


def taken_over(replicas: list[Controller], victim: Controller, k: int, since: float, timeout: float = 60) -> float:
    """Seconds from ``since`` until another replica holds shard ``k``."""
    wait_for(lambda: any(k in holding(r) for r in replicas if r is not victim), timeout, f"shard {k} taken over", 0.1)
    return time.monotonic() - since


@pytest.mark.parametrize("fault", ["sigkill", "cut-off"])
def test_a_replica_lost_mid_release_hands_its_shard_over_and_every_release_completes_once(
    cluster: Cluster, spread: tuple[list[str], str], tmp_path: Path, fault: str
) -> None:
    """``sigkill``: the holder of a shard is killed. ``cut-off``: it is frozen (SIGSTOP) longer than its
    Lease, its connections open, then let go on (SIGCONT): back, it finds its Lease taken, stops the shard
    without another write, and joins as a member again."""
    namespaces, system = spread
    assert isinstance(cluster, LocalCluster)  # spread skips on any other cluster
    since = now()
    replicas = start_replicas(cluster, namespaces, system, tmp_path)
    try:
        releases = start_releases(cluster, namespaces)
        # The release applied last: the first ones started while the others were being applied (30 kubectl
        # applies take 10-15 s here), and may be past batch 2 already.
        ns, name = releases[-1]

        def mid_release() -> bool:
            st = status(cluster, ns, name)
            return st.get("currentBatch", 0) >= 2 and st.get("phase") not in TERMINAL

        try:
            wait_for(mid_release, 60, f"{ns}/{name}: batch 2 under way")
        except AssertionError as err:
            raise AssertionError(f"{err}\n{stuck(cluster, ns, name, replicas)}") from None
        victim, k = victim_of(replicas, ns)  # the holder of a release under way
        assert victim.proc is not None
        lost = Lost(victim.proc.pid, now())
        if fault == "sigkill":
            victim.kill()
        else:
            victim.signal(signal.SIGSTOP)
        took = taken_over(replicas, victim, k, time.monotonic())
        print(f"shard {k} taken over {took:.1f}s after its replica was lost ({fault}; bound {LEASE + 5} s)")
        assert took <= LEASE + 5  # the Lease runs out, and the next round (every 2 s) takes it
        if fault == "cut-off":
            time.sleep(5)  # the releases go on under the new holder while the old one is still frozen
            lost = replace(lost, until=now())
            victim.signal(signal.SIGCONT)
            wait_for(lambda: f"shard {k} stopped" in victim.log.read_text(errors="replace"), 30, "old holder stopping")
            refused = victim.log.read_text(errors="replace").count("refused: this replica does not hold the shard")
            print(f"writes the old holder refused itself once back: {refused}")
        problems = check_completed_once(cluster, releases)
        checked, outside, in_flight = writes_outside_tenure(cluster, namespaces, system, since, lost)
        print(
            f"{checked} writes of the replicas checked against the shard Leases: {len(outside)} outside; "
            f"{len(in_flight)} sent before the replica was lost and received after its Lease was taken"
            + "".join(f"\n  {w}" for w in in_flight)
        )
        assert not problems, "\n".join(problems)
        assert checked > 30 * 5 and not outside, "\n".join(outside[:20])
    finally:
        stop_all(replicas)


def test_replicas_that_join_mid_release_take_shards_over_and_the_shard_kept_goes_on(
    cluster: Cluster, spread: tuple[list[str], str], tmp_path: Path
) -> None:
    """One replica holds every shard and drives 30 releases; two more join mid-release, it hands two shards
    over (their operators stop while the shard it keeps goes on in the same process), and every release
    completes once, every write within its writer's tenure. An operator stopping in a process once cancelled
    the tasks of the process's other operators (kopf reaps every task made after it started), and releases
    of the shard kept stopped moving."""
    namespaces, system = spread
    assert isinstance(cluster, LocalCluster)  # spread skips on any other cluster
    since = now()
    first = replica(cluster, namespaces, system, tmp_path, 0)
    first.start()
    replicas = [first]
    try:
        wait_for(lambda: holding(first) == set(range(SHARDS)), 60, "one replica holding every shard", 0.5)
        releases = start_releases(cluster, namespaces)
        ns, name = releases[-1]
        wait_for(lambda: status(cluster, ns, name).get("currentBatch", 0) >= 2, 60, f"{ns}/{name}: batch 2 under way")
        joined = time.monotonic()
        for i in (1, 2):
            replicas.append(replica(cluster, namespaces, system, tmp_path, i))
            replicas[-1].start()
        wait_for(lambda: all(len(holding(r)) == 1 for r in replicas), 60, "each replica holding one shard", 0.5)
        print(f"shards spread over the three replicas {time.monotonic() - joined:.1f}s after two joined")
        kept = holding(first)
        problems = check_completed_once(cluster, releases)
        checked, outside, _ = writes_outside_tenure(cluster, namespaces, system, since, Lost(pid=-1, since=now()))
        print(f"{checked} writes checked against the shard Leases: {len(outside)} outside; shard kept: {kept}")
        assert not problems, "\n".join(problems)
        assert checked > 30 * 5 and not outside, "\n".join(outside[:20])
    finally:
        stop_all(replicas)
