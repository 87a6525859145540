"""A GitOps tool as Argo CD and Flux behave towards the objects they apply, with kubectl as the only client.

The "repository" is a directory of manifests (one object per file, ``<kind>-<name>.yaml``, no namespace:
the tool applies them to its namespace). :meth:`GitOps.commit` writes a new version of a file and counts a
revision; :meth:`GitOps.apply` applies the whole directory once, as one sync; :meth:`GitOps.start` runs the
self-heal loop, which applies it every ``interval`` seconds (2 s by default) in a background thread until
:meth:`GitOps.stop`. Every apply is recorded (:class:`Apply`: the revision it applied, exit code, stderr,
duration), so a test can assert that none was refused.

How each :class:`Tool` applies, as the tools do it:

- ``ARGOCD``: Argo CD with the ``ServerSideApply=true`` sync option, ``kubectl apply --server-side
  --force-conflicts --field-manager=argocd-controller`` (gitops-engine forces conflicts).
- ``FLUX``: kustomize-controller, a server-side apply forcing ownership, ``--field-manager=kustomize-controller``.
- ``ARGOCD_CLIENT_SIDE``: Argo CD's default client-side apply (three-way merge with the
  ``last-applied-configuration`` annotation); Argo CD passes its manager name there too, so the
  writes carry ``fieldManager=argocd-controller`` with the operation ``Update``.

:meth:`GitOps.drift` is the tool's drift check, ``kubectl diff`` with the same apply: exit 0 in sync, 1 drift
(the diff text kept), anything else an error. For the server-side modes that is ``kubectl diff --server-side
--force-conflicts --field-manager=<manager>`` (a server-side dry-run apply; without ``--force-conflicts`` a
field another manager changed makes it fail with a conflict instead of showing the drift). For client-side
apply it is ``kubectl diff --field-manager=argocd-controller`` without ``--server-side``: a dry run of the
three-way patch the apply would send. ``--server-side`` there would answer what a server-side apply would
do instead: on a Service whose selector someone else extended it reports drift (a selector is an atomic map
for server-side apply) where the client-side apply changes nothing.

**Ignore rules** (:class:`Ignore`, ``GitOps(..., ignore=[...])``): Argo CD's ``ignoreDifferences`` with the
sync option ``RespectIgnoreDifferences=true``, which config/gitops/argocd/application.yaml ships, and Flux's
``driftIgnoreRules``, treated alike: the field at the rule's JSON pointer is applied and diffed with its live
value rather than Git's (Argo CD puts the live values of ignored fields into what it applies; left out when
the live object has none). The live objects are read with one ``kubectl get`` just before each apply and
each diff. So that an apply never undoes a write made between that read and the apply (a release moving its
weights: the emulator re-applies every two seconds, where Argo CD applies only when it finds drift), a
server-side apply sends those objects with the ``resourceVersion`` it read: a write in between makes the
API server refuse it (409 Conflict), and the apply is made again from a fresh read (counted in
``Apply.conflicts``). Client-side apply sends no ``resourceVersion`` (kubectl would keep it in the
last-applied annotation, and a later apply without it would then be refused), so it keeps that window, as
the real tools do when they sync: in a run of e2e/test_follow.py's Gateway API release with it, an apply read
the route just before the release put its rules back and then applied the rules it had read. (So its
client-side test splits the traffic by replicas, with no ignore rule: the release writes no field Git
declares.) A rule's pointer may end
at a list (``/spec/rules``), which is then taken whole, as Argo CD's merge patch of the live values takes it.

Not emulated: pruning, sync waves and hooks, that the real tools apply only when they find drift (the
loop applies everything, every time, as a tool would that found drift each time), Flux's removal of
``kubectl``'s field managers before its first apply, and the tools' own user agents (the requests carry
kubectl's; the field manager in their query string names the tool, see :func:`audited_requests`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from e2e.harness.controlplane import Cluster, KubectlError, LocalCluster
from e2e.harness.reliability import WRITE_VERBS, audit_events, parse_time


@dataclass(frozen=True)
class Tool:
    """How a GitOps tool applies: its field manager, and server-side or client-side apply."""

    name: str
    field_manager: str
    server_side: bool

    def apply_args(self) -> list[str]:
        if self.server_side:
            return ["--server-side", "--force-conflicts", f"--field-manager={self.field_manager}"]
        return [f"--field-manager={self.field_manager}"]

    def diff_args(self) -> list[str]:
        """``kubectl diff`` that predicts what :meth:`apply_args` would change (see the module docstring)."""
        return self.apply_args()


ARGOCD = Tool("argocd", "argocd-controller", server_side=True)
FLUX = Tool("flux", "kustomize-controller", server_side=True)
ARGOCD_CLIENT_SIDE = Tool("argocd-client-side", "argocd-controller", server_side=False)
TOOLS = (ARGOCD, FLUX, ARGOCD_CLIENT_SIDE)


@dataclass(frozen=True)
class Ignore:
    """An ignore rule: the field at ``pointer`` (RFC 6901) of the object ``kind``/``name`` is applied and diffed
    with its live value, not Git's (see the module docstring)."""

    kind: str
    name: str
    pointer: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return bool(obj.get("kind") == self.kind and (obj.get("metadata") or {}).get("name") == self.name)

    def parts(self) -> list[str]:
        return [p.replace("~1", "/").replace("~0", "~") for p in self.pointer.split("/")[1:]]


_ABSENT = object()


def _at(obj: Any, parts: list[str]) -> Any:
    for part in parts:
        if not isinstance(obj, dict) or part not in obj:
            return _ABSENT
        obj = obj[part]
    return obj


def _put(obj: dict[str, Any], parts: list[str], value: Any) -> None:
    """Sets (or, with ``_ABSENT``, removes) the member at ``parts`` of ``obj``, making the maps on the way."""
    for part in parts[:-1]:
        nxt = obj.get(part)
        if not isinstance(nxt, dict):
            if value is _ABSENT:
                return
            nxt = obj[part] = {}
        obj = nxt
    if value is _ABSENT:
        obj.pop(parts[-1], None)
    else:
        obj[parts[-1]] = copy.deepcopy(value)


@dataclass(frozen=True)
class Apply:
    """One apply of the repository: what it applied, and how it went."""

    revision: int
    at: datetime  # wall clock when kubectl started, to compare with the audit log
    started: float  # time.monotonic() then
    seconds: float
    code: int
    stdout: str
    stderr: str
    conflicts: int = 0  # applies refused (409) because an object with ignore rules changed after its read

    @property
    def ok(self) -> bool:
        return self.code == 0

    def __str__(self) -> str:
        said = (self.stderr or self.stdout).strip().replace("\n", " | ")
        return f"r{self.revision} {self.at:%H:%M:%S.%f} exit {self.code} in {self.seconds:.2f}s: {said}"


@dataclass(frozen=True)
class Drift:
    """What ``kubectl diff`` said: 0 in sync, 1 drift (``diff`` the text), more an error."""

    revision: int
    code: int
    diff: str
    stderr: str
    seconds: float

    @property
    def in_sync(self) -> bool:
        return self.code == 0

    def changed_lines(self) -> list[str]:
        """The diff's removed and added lines, without the file headers."""
        return [line for line in self.diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def file_name(manifest: Mapping[str, Any]) -> str:
    return f"{str(manifest['kind']).lower()}-{manifest['metadata']['name']}.yaml"


class GitOps:
    """A repository directory applied to ``namespace`` by ``tool``, once or in a self-heal loop."""

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        repo: Path,
        tool: Tool = ARGOCD,
        *,
        interval: float = 2.0,
        ignore: Sequence[Ignore] = (),
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.repo = repo
        self.tool = tool
        self.interval = interval
        self.ignore = tuple(ignore)
        self.repo.mkdir(parents=True, exist_ok=True)
        self.revision = 0
        self._files = threading.Lock()  # a commit and the read of the directory for an apply
        self._applying = threading.Lock()  # one apply at a time, as a tool syncs an application
        self._recorded = threading.Condition()
        self._applies: list[Apply] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the repository ------------------------------------------------------------------------------

    def commit(self, manifest: Mapping[str, Any] | str) -> int:
        """Writes ``manifest`` (an object, or the YAML of one) as its file in the repository, replacing the
        version there; returns the new revision. The next apply applies it."""
        obj = yaml.safe_load(manifest) if isinstance(manifest, str) else dict(manifest)
        text = yaml.safe_dump(obj, sort_keys=False)
        with self._files:
            path = self.repo / file_name(obj)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)
            self.revision += 1
            return self.revision

    def manifests(self) -> tuple[int, str]:
        """The repository as of now: its revision and every file, as one multi-document YAML stream."""
        with self._files:
            docs = [p.read_text() for p in sorted(self.repo.glob("*.yaml"))]
            return self.revision, "---\n".join(docs)

    def desired(self, *, lock: bool = False) -> tuple[int, str]:
        """What the tool applies (and diffs) now: the repository with, under its ignore rules, the live values
        of the fields they name (and with ``lock``, the live ``resourceVersion`` of those objects)."""
        revision, docs = self.manifests()
        if not self.ignore:
            return revision, docs
        objs = [o for o in yaml.safe_load_all(docs) if o]
        ruled = [o for o in objs if any(rule.matches(o) for rule in self.ignore)]
        if not ruled:
            return revision, docs
        refs = [f"{o['kind']}/{o['metadata']['name']}" for o in ruled]
        proc = self.cluster.kubectl(
            "get", *refs, "-n", self.namespace, "-o", "json", "--ignore-not-found", check=False, timeout=30
        )
        found = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else {}
        items = found.get("items", []) if found.get("kind") == "List" else ([found] if found else [])
        live = {(i["kind"], i["metadata"]["name"]): i for i in items}
        for obj in ruled:
            current = live.get((obj["kind"], obj["metadata"]["name"]))
            if current is None:
                continue  # not created yet: Git's values
            for rule in self.ignore:
                if rule.matches(obj):
                    _put(obj, rule.parts(), _at(current, rule.parts()))
            if lock:
                obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return revision, "---\n".join(yaml.safe_dump(o, sort_keys=False) for o in objs)

    # --- applying ------------------------------------------------------------------------------------

    def _kubectl(self, verb: str, *args: str, input: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(
            verb, "-n", self.namespace, "-f", "-", *args, input=input, check=False, timeout=timeout
        )

    def apply(self) -> Apply:
        """One sync: the whole repository applied as the tool applies it, recorded. With ignore rules and a
        server-side apply, made again (at most 5 times) while an object changed after its read."""
        lock = bool(self.ignore) and self.tool.server_side
        with self._applying:
            at, started = datetime.now(UTC), time.monotonic()
            conflicts = 0
            while True:
                revision, docs = self.desired(lock=lock)
                try:
                    proc = self._kubectl("apply", *self.tool.apply_args(), input=docs)
                    code, out, err = proc.returncode, proc.stdout, proc.stderr
                except subprocess.TimeoutExpired as exc:
                    code, out, err = -1, "", f"kubectl apply timed out after {exc.timeout}s"
                if not (lock and code != 0 and "the object has been modified" in err and conflicts < 5):
                    break
                conflicts += 1
            done = Apply(revision, at, started, time.monotonic() - started, code, out, err, conflicts)
        with self._recorded:
            self._applies.append(done)
            self._recorded.notify_all()
        return done

    @property
    def applies(self) -> list[Apply]:
        with self._recorded:
            return list(self._applies)

    def refused(self) -> list[Apply]:
        """The applies that did not exit 0."""
        return [a for a in self.applies if not a.ok]

    def next_apply(self, *, after: float | None = None, revision: int = 0, timeout: float = 15.0) -> Apply:
        """The first apply that started at or after ``after`` (a time.monotonic(); default: now) and applied
        at least ``revision``, waiting for it up to ``timeout`` seconds."""
        since = time.monotonic() if after is None else after
        deadline = time.monotonic() + timeout
        with self._recorded:
            while True:
                for a in self._applies:
                    if a.started >= since and a.revision >= revision:
                        return a
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"no apply of revision >= {revision} within {timeout}s; the last ones: "
                        + "; ".join(str(a) for a in self._applies[-3:])
                    )
                self._recorded.wait(left)

    # --- the self-heal loop --------------------------------------------------------------------------

    def start(self) -> None:
        """Applies now, then every ``interval`` seconds (counted from the start of each apply; an apply that
        takes longer is followed at once) until :meth:`stop`."""
        if self._thread is not None:
            raise RuntimeError("the self-heal loop is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"gitops-{self.tool.name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.apply()
            self._stop.wait(max(0.0, began + self.interval - time.monotonic()))

    def stop(self) -> None:
        """Stops the loop after the apply under way, if any."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None

    @contextlib.contextmanager
    def self_heal(self) -> Iterator[GitOps]:
        self.start()
        try:
            yield self
        finally:
            self.stop()

    # --- what the tool would see ---------------------------------------------------------------------

    def drift(self, *, check: bool = True) -> Drift:
        """``kubectl diff`` as the tool's apply would act: exit 0 in sync, 1 drift. With ``check``, any other
        exit (a conflict, an invalid manifest) raises."""
        revision, docs = self.desired()
        started = time.monotonic()
        proc = self._kubectl("diff", *self.tool.diff_args(), input=docs)
        found = Drift(revision, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)
        if check and found.code not in (0, 1):
            raise KubectlError(proc.returncode, ["kubectl", "diff"], proc.stdout, proc.stderr)
        return found

    def dry_run_apply(self) -> list[dict[str, Any]]:
        """Every object of the repository as the API server would store it after this tool's apply
        (``--dry-run=server``: admission runs, mutating webhooks included; nothing is written)."""
        _, docs = self.desired()
        proc = self._kubectl("apply", *self.tool.apply_args(), "--dry-run=server", "-o", "json", input=docs)
        if proc.returncode != 0:
            raise KubectlError(proc.returncode, ["kubectl", "apply", "--dry-run=server"], proc.stdout, proc.stderr)
        out = json.loads(proc.stdout)
        return list(out["items"]) if out.get("kind") == "List" else [out]


# --- the audit log --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditedRequest:
    """A write the local API server audited, with what its query string and impersonation say."""

    at: datetime
    verb: str
    resource: str
    subresource: str
    name: str
    code: int
    user: str
    impersonated: str
    agent: str
    field_manager: str
    force: bool
    dry_run: bool

    def __str__(self) -> str:
        sub = f"/{self.subresource}" if self.subresource else ""
        who = self.impersonated or self.user
        return (
            f"{self.at:%H:%M:%S.%f} {self.verb} {self.resource}{sub}/{self.name} {self.code} "
            f"manager={self.field_manager} force={self.force} dryRun={self.dry_run} as {who}"
        )


def audited_requests(cluster: LocalCluster, namespace: str, *, since: datetime | None = None) -> list[AuditedRequest]:
    """Every write in ``namespace`` the local API server audited since ``since`` (dry runs included: see
    ``dry_run``), by any client. The field manager is the request's ``fieldManager`` parameter ("" when
    the client sent none: the API server then names the manager after the user agent)."""
    found: list[AuditedRequest] = []
    for ev in audit_events(cluster.audit_log):
        if ev.get("verb") not in WRITE_VERBS:
            continue
        ref = ev.get("objectRef") or {}
        if ref.get("namespace") != namespace:
            continue
        at = parse_time(ev["requestReceivedTimestamp"])
        if since is not None and at < since:
            continue
        query = parse_qs(urlsplit(ev.get("requestURI", "")).query)
        found.append(
            AuditedRequest(
                at=at,
                verb=ev["verb"],
                resource=ref.get("resource", ""),
                subresource=ref.get("subresource", ""),
                name=ref.get("name", ""),
                code=int((ev.get("responseStatus") or {}).get("code") or 0),
                user=(ev.get("user") or {}).get("username", ""),
                impersonated=(ev.get("impersonatedUser") or {}).get("username", ""),
                agent=ev.get("userAgent") or "",
                field_manager=(query.get("fieldManager") or [""])[0],
                force=(query.get("force") or [""])[0] == "true",
                dry_run="dryRun" in query,
            )
        )
    return found
