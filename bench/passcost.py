"""The CPU of one idle reconcile pass: a release waiting in a batch's pause, passed over again and again.

No cluster: the release, its Deployment and Service on the in-memory API server
(:class:`~greyrelease.kube.memory.MemoryKube`), driven by the real :class:`Reconciler` (exporting the
per-release series, as the controller's does) until its batch 2 is live and paused for an hour, then
``--passes`` more passes inside that pause (each a few milliseconds of the release's clock after the
last), timed with ``time.process_time``; the best of ``--rounds`` rounds, in microseconds per pass (20
rounds of 500 by default: on a busy machine, the best of many short rounds varies less than that of a
few long ones). Every timed pass must write nothing: a round that writes is an error.

Scenarios: ``pinned``, a release to ``targetVersion`` v2 in three batches (1, 2 paused 1 h, 4 replicas of
4); ``follow``, a follow-mode release of a template a GitOps sync applied to a Deployment the admission
webhook holds (the unit tests' followed world, ``tests/support/follow_cluster.py``), its batch 1 paused
for an hour.
``--profile`` runs one round under cProfile and prints its top lines by own time.

The in-memory server copies each object it serves, as a client's decoding would; the pass's own work
(observe, decide, compare the status) is the rest. See bench/README.md, "Packages by layer, before and
after".

Usage: python -m bench.passcost [--scenario pinned|follow] [--passes 500] [--rounds 20] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pstats
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from greyrelease.api.release import Obj
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import path
from greyrelease.reconcile.reconciler import Reconciler
from greyrelease.reconcile.release_metrics import ReleaseSeries

NS = "shop"
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
DEPLOYMENTS = path("apps", "v1", "deployments", NS)
RELEASE = path("greyrelease.io", "v1", "greyreleases", NS, "web")
#: The release's clock between two timed passes: 10,000 of them take 50 s of the hour's pause.
STEP = timedelta(milliseconds=5)
WARM = 50


def _pinned_world() -> tuple[MemoryKube, Callable[[], None]]:
    """Deployment ``web`` (4 replicas of app:v1), its Service, and a GreyRelease of it to v2 whose batch 2
    pauses for an hour; and the control plane between passes (every Deployment's pods all ready)."""
    stable: Obj = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS, "uid": "web-uid", "labels": {"app": "web"}},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": "app:v1"}]},
            },
        },
    }
    service: Obj = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    }
    release: Obj = {
        "apiVersion": "greyrelease.io/v1",
        "kind": "GreyRelease",
        "metadata": {"name": "web", "namespace": NS, "uid": "release-uid"},
        "spec": {
            "targetRef": {"name": "web"},
            "targetVersion": "v2",
            "batches": [{"replicas": 1}, {"replicas": 2, "pause": "1h"}, {"replicas": 4}],
        },
    }
    kube = MemoryKube(stable, service, release)

    def roll_out() -> None:
        kube.collect()
        for d in kube.objects(DEPLOYMENTS):
            meta, replicas = d["metadata"], d["spec"].get("replicas", 1)
            status = {
                "observedGeneration": meta["generation"],
                "replicas": replicas,
                "readyReplicas": replicas,
                "updatedReplicas": replicas,
                "availableReplicas": replicas,
            }
            if d.get("status") != status:
                kube.put({**d, "status": status})
            template = d["spec"]["template"]
            digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
            name = f"{meta['name']}-{digest}"
            if kube.get(path("apps", "v1", "replicasets", NS, name)) is None:
                kube.put(
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "metadata": {
                            "name": name,
                            "namespace": NS,
                            "labels": {**template["metadata"]["labels"], "pod-template-hash": digest},
                            "ownerReferences": [{"uid": meta["uid"], "controller": True}],
                        },
                    }
                )

    roll_out()
    return kube, roll_out


def _follow_world() -> tuple[MemoryKube, Callable[[], None]]:
    """The unit tests' followed Deployment, idle, then a new template synced by GitOps (held)."""
    from tests.support import follow_cluster

    batches = [{"replicas": "25%", "pause": "1h"}, {"replicas": "50%", "pause": "30s"}, {"replicas": "100%"}]
    kube = follow_cluster.cluster(trafficRouting={"service": {"name": "web"}}, batches=batches)
    reconciler, now = Reconciler(kube), T0
    for _ in range(20):
        reconciler.reconcile(NS, "web", now=now)
        if _status(kube).get("phase") == "Idle":
            break
        follow_cluster.roll_out(kube)
        now += timedelta(seconds=1)
    else:
        raise SystemExit(f"the followed release never went idle: {_status(kube)}")
    follow_cluster.commit(kube, "app:v2", flag="off")
    return kube, lambda: follow_cluster.roll_out(kube)


SCENARIOS = {"pinned": (_pinned_world, 2), "follow": (_follow_world, 1)}


def _status(kube: MemoryKube) -> Obj:
    return dict((kube.get(RELEASE) or {}).get("status") or {})


def paused(scenario: str) -> tuple[MemoryKube, Reconciler, datetime]:
    """The world of ``scenario`` passed over until its pausing batch is live and ready (its pause under
    way), a reconciler for it, and the release's clock then."""
    build, batch = SCENARIOS[scenario]
    kube, roll_out = build()
    # With the per-release series the controller exports (greyrelease.runtime.controller.Runtime).
    reconciler, now = Reconciler(kube, series=ReleaseSeries()), T0 + timedelta(minutes=1)
    for _ in range(40):
        reconciler.reconcile(NS, "web", now=now)
        status = _status(kube)
        if status.get("currentBatch") == batch and (status.get("batchTimes") or {}).get("readyAt"):
            return kube, reconciler, now
        roll_out()
        now += timedelta(seconds=2)
    raise SystemExit(f"{scenario}: batch {batch} never went live: {_status(kube)}")


def timed(kube: MemoryKube, reconciler: Reconciler, now: datetime, passes: int) -> tuple[float, datetime]:
    """CPU seconds of ``passes`` passes from ``now``, and the clock after them. Fails when one writes."""
    kube.requests.clear()
    start = time.process_time()
    for _ in range(passes):
        now += STEP
        reconciler.reconcile(NS, "web", now=now)
    spent = time.process_time() - start
    if kube.writes:
        raise SystemExit(f"an idle pass wrote: {kube.writes[:3]}")
    return spent, now


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), default="pinned")
    ap.add_argument("--passes", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--profile", action="store_true", help="one round under cProfile; its top lines")
    ap.add_argument("--top", type=int, default=25, help="lines of the profile printed")
    args = ap.parse_args(argv)
    if (WARM + args.passes * (1 if args.profile else args.rounds)) * STEP >= timedelta(minutes=50):
        ap.error("that many passes would outlast the pause")
    kube, reconciler, now = paused(args.scenario)
    _, now = timed(kube, reconciler, now, WARM)  # warm: first-pass caches, the status as written
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        timed(kube, reconciler, now, args.passes)
        profile.disable()
        pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(args.top)
        return 0
    rounds = []
    for _ in range(args.rounds):
        spent, now = timed(kube, reconciler, now, args.passes)
        rounds.append(spent / args.passes * 1e6)
    middle = sorted(rounds)[len(rounds) // 2]
    print(
        f"{args.scenario}: {min(rounds):.0f} us per idle pass (best of {args.rounds} rounds of {args.passes};"
        f" median {middle:.0f} us)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
