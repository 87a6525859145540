"""Observation for governance: the policies that govern a release, the queue it is in, and the releases
it comes after, read through a :class:`~greyrelease.kube.protocol.Kube` (the controller serves these reads from
memory). The rules themselves are pure and live in :mod:`greyrelease.planner.governance`.

What is read, and when (a release that cannot start a batch in this pass reads nothing it does not need):

- the policies: every pass, from memory;
- the slots Lease and the releases of its queue: only while the release is waiting to start, or may
  start again (a new version, a retry) and is under a limit;
- the releases of ``spec.after``: only while the release is waiting to start.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from greyrelease.api.release import (
    GROUP,
    GROUP_LABEL,
    PLURAL,
    POLICY_PLURAL,
    RETRY_ANNOTATION,
    TERMINAL_PHASES,
    VERSION,
    GreyReleasePolicy,
    GreyReleaseSpec,
    GreyReleaseStatus,
    Obj,
    Phase,
    parse_time,
)
from greyrelease.kube.cache import uncached
from greyrelease.kube.protocol import Kube, NotFound, Ref, path
from greyrelease.planner.governance import Predecessor, Queue, Rules, Source, find_cycle, queue_order
from greyrelease.planner.machine import progressing
from greyrelease.reconcile.slots import Holder, holders_of, lease_path

log = logging.getLogger("greyrelease")

POLICIES_PATH = path(GROUP, VERSION, POLICY_PLURAL)
#: The prefix of the names of the Leases that hold the slots of each queue.
LEASE_PREFIX = "greyrelease-slots"
_NOT_NAME = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class Governing:
    """The controller's own governance settings (``greyrelease run`` flags)."""

    #: ``--max-progressing``: at most this many releases progress at once in every namespace.
    max_progressing: int | None = None
    #: Where the Leases of queues across namespaces (``per: Group``) live: the controller's namespace.
    slots_namespace: str = "greyrelease-system"


@dataclass(frozen=True)
class QueueRef:
    scope: str  # as messages show it
    lease: str  # namespace/name
    limit: int
    across: bool = False  # one queue across namespaces (a group), not one namespace's


@dataclass(frozen=True)
class Governance:
    rules: Rules
    queue: Queue | None
    predecessors: tuple[Predecessor, ...]
    cycle: tuple[str, ...]


def releases_path(namespace: str | None = None) -> Ref:
    return path(GROUP, VERSION, PLURAL, namespace)


def read_policies(kube: Kube) -> list[GreyReleasePolicy]:
    """Every policy the models accept, by name (one they refuse is skipped: the API server's schema
    stops most; a log line says which)."""
    try:
        found = kube.list(POLICIES_PATH)
    except NotFound:  # the policy CRD is not installed: no policies
        return []
    out = []
    for obj in found:
        try:
            out.append(GreyReleasePolicy.model_validate(obj))
        except ValidationError as err:
            log.warning(f"GreyReleasePolicy {obj.get('metadata', {}).get('name')}: ignored: {err.errors()[0]['msg']}")
    return sorted(out, key=lambda p: str(p.metadata.get("name", "")))


def governed_by(policies: list[Obj], release: Obj) -> tuple[tuple[str, str], ...]:
    """The name and resourceVersion of each of ``policies`` (as listed) that governs ``release``: what a
    pass's plan takes from the policies depends on those only."""
    models = []
    for obj in policies:
        try:
            models.append(GreyReleasePolicy.model_validate(obj))
        except ValidationError:  # skipped by the pass too (read_policies)
            continue
    return tuple(
        sorted(
            (str(p.metadata.get("name", "")), str(p.metadata.get("resourceVersion", "")))
            for p in governing(models, release)
        )
    )


def _labels(release: Obj) -> dict[str, str]:
    return dict((release.get("metadata") or {}).get("labels") or {})


def governing(policies: list[GreyReleasePolicy], release: Obj) -> list[GreyReleasePolicy]:
    meta = release.get("metadata") or {}
    return [p for p in policies if p.spec.governs(meta.get("namespace", ""), _labels(release))]


def rules_of(policies: list[GreyReleasePolicy]) -> Rules:
    sources = []
    for p in policies:
        if p.spec.windows or p.spec.freezes:
            name = f"GreyReleasePolicy {p.metadata.get('name', '')}"
            sources.append(Source(name, tuple(p.spec.windows or ()), tuple(p.spec.freezes or ())))
    return Rules(tuple(sources))


def rules_for(kube: Kube, release: Obj) -> Rules:
    """The windows and freezes of the policies that would govern ``release`` (a manifest: its namespace
    defaults to ``default``)."""
    meta = release.get("metadata") or {}
    doc = {**release, "metadata": {**meta, "namespace": meta.get("namespace") or "default"}}
    return rules_of(governing(read_policies(kube), doc))


def _lease_name(*parts: str) -> str:
    """``greyrelease-slots-<parts>`` as a valid object name (a short hash keeps distinct values apart once
    characters had to be replaced)."""
    raw = "-".join(parts)
    clean = _NOT_NAME.sub("-", raw.lower()).strip("-")[:200]
    if clean != raw:
        clean += "-" + hashlib.sha256(raw.encode()).hexdigest()[:8]
    return f"{LEASE_PREFIX}-{clean}"


def queue_of(release: Obj, policies: list[GreyReleasePolicy], settings: Governing) -> QueueRef | None:
    """The queue a release is in: that of the first policy (by name) that governs it and sets a limit
    (with ``per: Group``, only when the release has a ``greyrelease.io/group`` label), else the one of
    ``--max-progressing`` for its namespace, else none. Every queue's Lease lives in the controller's own
    namespace: the controller writes Leases nowhere else."""
    namespace = (release.get("metadata") or {}).get("namespace", "")
    home = settings.slots_namespace
    for p in policies:
        c = p.spec.concurrency
        if c is None:
            continue
        name = str(p.metadata.get("name", ""))
        if c.per == "Namespace":
            scope = f"namespace {namespace} (GreyReleasePolicy {name})"
            return QueueRef(scope, f"{home}/{_lease_name(name, 'ns', namespace)}", c.max_progressing)
        group = _labels(release).get(GROUP_LABEL)
        if group:
            scope = f"group {group} (GreyReleasePolicy {name})"
            return QueueRef(scope, f"{home}/{_lease_name(name, 'group', group)}", c.max_progressing, across=True)
    if settings.max_progressing:
        scope = f"namespace {namespace}"
        return QueueRef(scope, f"{home}/{_lease_name('ns', namespace)}", settings.max_progressing)
    return None


def may_start(
    status: GreyReleaseStatus, spec: GreyReleaseSpec, annotations: dict[str, str], *, pending: bool = False
) -> bool:
    """Whether a pass of this release could start batch 1 (and so needs what it waits for). ``pending``:
    follow mode, the Deployment holds a template to release, which a release at rest starts."""
    phase = status.phase
    if phase in (None, Phase.INVALID_SPEC, Phase.INITIALIZING, Phase.WAITING, Phase.QUEUED):
        return True
    if phase in TERMINAL_PHASES and spec.follows:
        return pending or RETRY_ANNOTATION in annotations
    if phase in TERMINAL_PHASES:
        new_version = status.target_version not in ("", spec.target_version or "")
        return new_version or (phase != Phase.SUCCEEDED and RETRY_ANNOTATION in annotations)
    return False


def _status(obj: Obj) -> GreyReleaseStatus:
    try:
        return GreyReleaseStatus.model_validate(obj.get("status") or {})
    except ValidationError:
        return GreyReleaseStatus()


def _ended(kube: Kube, holder: Holder) -> bool:
    """A holder that is gone, or whose release stopped progressing after it took the slot (a release that
    has just taken one may not show its new phase yet: it is not counted out)."""
    found = kube.get(releases_path(holder.namespace).named(holder.name))
    if found is None or (found.get("metadata") or {}).get("uid") != holder.uid:
        return True
    st = _status(found)
    since = parse_time(holder.since)
    return not progressing(st) and st.phase_started_at is not None and since is not None and st.phase_started_at > since


def _order(obj: Obj) -> tuple[datetime, str, str]:
    meta = obj.get("metadata") or {}
    return queue_order(parse_time(meta.get("creationTimestamp")), meta.get("namespace", ""), meta.get("name", ""))


def read_queue(
    kube: Kube, release: Obj, ref: QueueRef, policies: list[GreyReleasePolicy], settings: Governing
) -> Queue:
    """The queue as this release sees it: who holds its slots (from the Lease) and how many wait ahead of
    it. The releases ahead are counted from memory; when that says a slot is free for this release, they
    are counted again from the API server before it takes it: a controller that has just started may not
    have heard of every release yet, and one created earlier must not be overtaken."""
    uid = release["metadata"]["uid"]
    holders = holders_of(kube.get(lease_path(ref.lease)))
    stale = tuple(h.uid for h in holders if h.uid != uid and _ended(kube, h))
    live = {h.uid for h in holders if h.uid not in stale}
    collection = releases_path(None if ref.across else release["metadata"]["namespace"])
    ahead = _ahead(kube.list(collection), release, ref, live, policies, settings)
    queue = Queue(ref.scope, ref.lease, ref.limit, tuple(sorted(live)), ahead, uid in live, stale)
    if queue.may_take():
        ahead = _ahead(uncached(kube).list(collection), release, ref, live, policies, settings)
        queue = Queue(ref.scope, ref.lease, ref.limit, tuple(sorted(live)), ahead, uid in live, stale)
    return queue


def _ahead(
    others: list[Obj],
    release: Obj,
    ref: QueueRef,
    live: set[str],
    policies: list[GreyReleasePolicy],
    settings: Governing,
) -> int:
    """Releases of the same queue created before ``release`` that wait for a slot (not started yet)."""
    uid, mine, count = release["metadata"]["uid"], _order(release), 0
    for other in others:
        meta = other.get("metadata") or {}
        if meta.get("uid") in live or meta.get("uid") == uid or _order(other) >= mine:
            continue
        if (other.get("status") or {}).get("phase") not in (None, "", Phase.QUEUED):
            continue  # started, ended, or waiting for something else than a slot
        if queue_of(other, governing(policies, other), settings) == ref:
            count += 1
    return count


def read_predecessors(kube: Kube, namespace: str, spec: GreyReleaseSpec) -> tuple[Predecessor, ...]:
    out = []
    for after in spec.after or ():
        found = kube.get(releases_path(namespace).named(after.name))
        if found is None:
            out.append(Predecessor(after.name))
            continue
        st = _status(found)
        current = st.observed_generation == int((found.get("metadata") or {}).get("generation", 0))
        phase = st.phase.value if st.phase else ""
        if phase and not current:
            phase += " for an earlier spec"
        out.append(
            Predecessor(
                after.name,
                found=True,
                phase=phase,
                # A followed Deployment with nothing to release (Idle) holds nobody back.
                succeeded=current and st.phase in (Phase.SUCCEEDED, Phase.IDLE),
                failed=current and st.phase in (Phase.FAILED, Phase.ABORTED, Phase.INVALID_SPEC),
            )
        )
    return tuple(out)


def read_cycle(kube: Kube, release: Obj, spec: GreyReleaseSpec) -> tuple[str, ...]:
    """A cycle of ``spec.after`` through this release, read from the releases of its namespace."""
    meta = release["metadata"]
    edges: dict[str, tuple[str, ...]] = {meta["name"]: tuple(a.name for a in spec.after or ())}
    for other in kube.list(releases_path(meta["namespace"])):
        name = (other.get("metadata") or {}).get("name", "")
        if name != meta["name"]:
            after: Any = (other.get("spec") or {}).get("after") or []
            edges[name] = tuple(str(a.get("name", "")) for a in after if isinstance(a, dict))
    return tuple(find_cycle(meta["name"], edges) or ())


def observe_governance(
    kube: Kube,
    release: Obj,
    spec: GreyReleaseSpec,
    status: GreyReleaseStatus,
    annotations: dict[str, str],
    settings: Governing,
    *,
    pending: bool = False,
) -> Governance:
    policies = governing(read_policies(kube), release)
    rules = rules_of(policies)
    ref = queue_of(release, policies, settings)
    queue: Queue | None = None
    starting = may_start(status, spec, annotations, pending=pending)
    if ref is not None:
        if progressing(status):
            queue = Queue(ref.scope, ref.lease, ref.limit, (), 0, held=True)  # taken when it started
        elif starting:
            queue = read_queue(kube, release, ref, read_policies(kube), settings)
    predecessors: tuple[Predecessor, ...] = ()
    cycle: tuple[str, ...] = ()
    if spec.after and starting:
        cycle = read_cycle(kube, release, spec)
        predecessors = read_predecessors(kube, release["metadata"]["namespace"], spec)
    return Governance(rules, queue, predecessors, cycle)
