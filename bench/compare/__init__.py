"""`make compare`: GreyRelease and Argo Rollouts on the same releases, on one local cluster, one after the other.

For each N and each controller (GreyRelease first, then Argo Rollouts' rollouts-controller), on a fresh
controller process watching every namespace with its leader election on:

1. N apps of 2 replicas with a Service each (replica-ratio mode: the Service selects every pod of the
   app, so a canary pod takes its share of the traffic). GreyRelease: a Deployment + a GreyRelease.
   Argo: a Rollout carrying the same pod template (not a ``workloadRef`` to a Deployment: see
   bench/COMPARISON.md for why).
2. All N released at once from v1 to v2: 1 canary pod of 2 (Argo: ``setWeight: 50``, which is 1 pod of
   2 without a traffic router), a 2 s pause, then all pods, then promotion.
3. The cluster settled, 60 s idle.
4. Up to 200 apps released again (v3) and held at a pause without end, then aborted all at once by 8
   writers (GreyRelease: the ``greyrelease.io/abort`` annotation; Argo: a merge patch of
   ``status.abort: true`` on the status subresource, which is what ``kubectl argo rollouts abort`` sends):
   from the write to the canary pods gone from the ready endpoints of the app's EndpointSlices.
5. The same number of apps behind an nginx canary Ingress (weights on a canary Ingress, no ingress
   controller needed to read them), held at the first pause, aborted: from the write to the canary
   Ingress' ``canary-weight`` being 0.

Before the sizes, the abort cut-off on real requests (``--cutoff-aborts``, 10 by default): the data plane
of the e2e tests (Traefik, pods that answer HTTP on their own addresses) is started for that stage only; one
app of 4 answering pods behind an Ingress of class traefik takes 100 requests/s, is released to 1 canary
pod of 4 and aborted, 10 times per controller: from the abort write (its receipt in the API server's audit
log) to the send time of the last request a canary pod answered (``run_cutoff``).

Every time is taken by this process from watches (the same probe for both controllers): the lag of the
step after the 2 s pause is (advance seen) - (pause seen) - 2 s, completion is the last release seen
done. The controller's CPU and RSS come from /proc, its API requests from the API server's audit log by
User-Agent (bench/audit.py, which also logs reads).

The package, one module per concern:

- cluster: the cluster and the apps on it (CRDs, namespaces, each app's objects, pods settled)
- contender: driving one controller (what differs between the two), and GreyRelease's side
- argo: Argo Rollouts' side (its controller and CRDs, a Rollout per app, its status read)
- probes: what is measured and how (watches of releases, endpoints and canary Ingresses; the audit log)
- scale: one controller at one N (``run_one``), step by step
- cutoff: the abort cut-off on real requests (``run_cutoff``)
- report: COMPARISON.md's measured part and comparison.png, from comparison.json
- cli: the command line, the stages in order

Usage: python -m bench.compare --sizes 100 500 1000 [--cutoff-aborts 10] [--out bench/COMPARISON.md]
"""

from __future__ import annotations

from bench.compare.argo import ArgoContender
from bench.compare.cli import main
from bench.compare.contender import Contender, GreyReleaseContender
from bench.compare.cutoff import run_cutoff
from bench.compare.probes import cutting_writes, latencies
from bench.compare.report import memory_fit, memory_section, ratio, write_report
from bench.compare.scale import run_one

__all__ = [
    "ArgoContender",
    "Contender",
    "GreyReleaseContender",
    "cutting_writes",
    "latencies",
    "main",
    "memory_fit",
    "memory_section",
    "ratio",
    "run_cutoff",
    "run_one",
    "write_report",
]
