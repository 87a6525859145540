"""The API server's audit log, counted by client: what bench/compare/ needs beyond e2e/harness/reliability.py.

The local cluster's audit policy (e2e/harness/controlplane.py) logs writes only, with their bodies; a
comparison of two controllers also wants their reads (GET, LIST, WATCH), by user agent.
``AuditedCluster`` is the same local cluster with a policy that adds every read at the Metadata level
(no body); the users the harness leaves out (KWOK, the scheduler, the controller-manager) stay out.
``requests`` counts the requests of one client (by User-Agent prefix) in a time window, reads and writes;
``requests_by_window`` the same for several windows in one reading of the log; ``write_lines`` lists writes
with their bodies (what a write where none was expected changed).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from e2e.harness.controlplane import AUDIT_QUIET_USERS, LocalCluster
from e2e.harness.reliability import WRITE_VERBS, audit_events, dry_run, parse_time


def write_audit_policy_with_reads(path: Path) -> Path:
    """The harness's policy, plus reads (level Metadata: who, what, when; no body). A watch is logged when
    it starts (ResponseStarted, the stage only long-running requests have) and again when it ends, so that
    one still open is counted too; :func:`requests` counts each request once."""
    policy = {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            {"level": "None", "users": list(AUDIT_QUIET_USERS)},
            {"level": "None", "userGroups": ["system:serviceaccounts:kube-system", "system:nodes"]},
            {"level": "None", "nonResourceURLs": ["/*"]},
            {"level": "Metadata", "verbs": ["get", "list", "watch"]},
            {"level": "Request", "verbs": list(WRITE_VERBS)},
        ],
    }
    path.write_text(json.dumps(policy, indent=2))  # JSON is YAML
    return path


class AuditedCluster(LocalCluster):
    """A LocalCluster whose API server also audits reads (restarts of the API server use the same policy)."""

    def audit_policy(self, path: Path) -> Path:
        return write_audit_policy_with_reads(path)


def requests(
    cluster: LocalCluster, agents: tuple[str, ...], since: datetime, until: datetime | None = None
) -> Counter[tuple[str, str, str]]:
    """Requests by clients whose User-Agent starts with one of ``agents``, received in [since, until),
    counted by (verb, resource[/subresource], namespace); a dry run's verb is ``dryrun <verb>`` (it
    stores nothing: not a write)."""
    return requests_by_window(cluster.audit_log, agents, {"": (since, until)})[""]


def requests_by_window(
    log: Path, agents: tuple[str, ...], windows: Mapping[str, tuple[datetime, datetime | None]]
) -> dict[str, Counter[tuple[str, str, str]]]:
    """:func:`requests` for each named window [since, until) (until None: to the end of the log), read in
    one pass over the audit log ``log``. Each request is counted once, by its audit ID (a watch has an event
    when it starts and another when it ends)."""
    counts: dict[str, Counter[tuple[str, str, str]]] = {name: Counter() for name in windows}
    seen: set[str] = set()
    for ev in audit_events(log):
        if not (ev.get("userAgent") or "").startswith(agents):
            continue
        audit_id = ev.get("auditID") or ""
        if audit_id in seen:
            continue
        if audit_id:
            seen.add(audit_id)
        at = parse_time(ev["requestReceivedTimestamp"])
        ref = ev.get("objectRef") or {}
        resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        verb = ev.get("verb", "")
        key = (f"dryrun {verb}" if dry_run(ev) else verb, resource, ref.get("namespace", ""))
        for name, (since, until) in windows.items():
            if since <= at and (until is None or at < until):
                counts[name][key] += 1
    return counts


def write_lines(
    log: Path,
    agents: tuple[str, ...],
    since: datetime,
    until: datetime | None = None,
    *,
    limit: int = 20,
) -> list[str]:
    """The first ``limit`` writes (Leases and dry runs left out) by clients whose User-Agent starts with one
    of ``agents`` received in [since, until), one line each: when, the verb, the object and the body sent,
    so that a write where none was expected says what it changed."""
    out: list[str] = []
    seen: set[str] = set()
    for ev in audit_events(log):
        if not (ev.get("userAgent") or "").startswith(agents) or ev.get("verb") not in WRITE_VERBS or dry_run(ev):
            continue
        ref = ev.get("objectRef") or {}
        audit_id = ev.get("auditID") or ""
        if ref.get("resource") == "leases" or audit_id in seen:
            continue
        seen.add(audit_id)
        at = parse_time(ev["requestReceivedTimestamp"])
        if at < since or (until is not None and at >= until):
            continue
        resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        body = json.dumps(ev.get("requestObject"), separators=(",", ":"), sort_keys=True)
        code = (ev.get("responseStatus") or {}).get("code", "")
        out.append(
            f"{at:%H:%M:%S.%f} {ev['verb']} {resource} {ref.get('namespace', '')}/{ref.get('name', '')} "
            f"-> {code}: {body}"
        )
        if len(out) >= limit:
            break
    return out


def split(counts: Counter[tuple[str, str, str]]) -> dict[str, Counter[str]]:
    """Reads and writes by "verb resource", leader election (every request on a Lease) apart."""
    out: dict[str, Counter[str]] = {
        "reads": Counter(),
        "writes": Counter(),
        "lease_reads": Counter(),
        "lease_writes": Counter(),
    }
    for (verb, resource, _ns), n in counts.items():
        kind = "writes" if verb in WRITE_VERBS else "reads"
        out[f"lease_{kind}" if resource == "leases" else kind][f"{verb} {resource}"] += n
    return out


def writes(
    cluster: LocalCluster, agents: tuple[str, ...], namespace: str, since: datetime
) -> list[tuple[float, str, str]]:
    """Successful writes (not dry runs) by clients whose User-Agent starts with one of ``agents`` in
    ``namespace``, received from ``since`` on: (when, as a Unix time; resource[/subresource]; object name),
    oldest first."""
    out: list[tuple[float, str, str]] = []
    for ev in audit_events(cluster.audit_log):
        ref = ev.get("objectRef") or {}
        if ev.get("verb") not in WRITE_VERBS or ref.get("namespace") != namespace or dry_run(ev):
            continue
        if not (ev.get("userAgent") or "").startswith(agents):
            continue
        if not 200 <= int((ev.get("responseStatus") or {}).get("code") or 0) < 300:
            continue
        at = parse_time(ev["requestReceivedTimestamp"])
        if at >= since:
            resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            out.append((at.timestamp(), resource, ref.get("name", "")))
    return sorted(out)
