"""``kubectl gr``: the kubectl plugin for GreyReleases (installed as the ``kubectl-gr`` console script).

    kubectl gr status NAME [-n NS] [-w [--keep]]   phase, batch progress, weight, replicas, metrics, events
    kubectl gr abort|pause|resume|retry NAME       the greyrelease.io/ annotations the controller acts on
    kubectl gr promote NAME [--full]               approve the current batch (or skip to the end)
    kubectl gr plan -f FILE [--replicas N] [--start T]   the batches of a release and when each would start
    kubectl gr dashboard [-n NS | -A] [--address A] [--port N]   a live web page of the releases, with the buttons

Credentials are the user's, as kubectl would find them: ``--kubeconfig``, then ``$KUBECONFIG``, then
``~/.kube/config`` (``--context`` picks a context), and in-cluster credentials when there is no kubeconfig.
The namespace is ``-n``, else the context's, else ``default``.

What is shown is computed by :func:`render_status`, a pure function of the object, its events and ``now``.
A request (abort, pause, resume, promote, retry) is written by :func:`steer`, for the commands and for the
dashboard's buttons (:mod:`greyrelease.cli.dashboard`) alike.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TextIO

from urllib3.exceptions import HTTPError

from greyrelease.api.release import (
    ABORT_ANNOTATION,
    GROUP,
    KIND,
    PAUSE_ANNOTATION,
    PLURAL,
    PROMOTE_ANNOTATION,
    RETRY_ANNOTATION,
    SINGULAR,
    TERMINAL_PHASES,
    TRACK_LABEL,
    VERSION,
    Obj,
    parse_time,
)
from greyrelease.kube.cache import Watchable
from greyrelease.kube.client import ApiError, KubeClient, NotFound, path
from greyrelease.kube.protocol import Kube
from greyrelease.planner.follow import template_text

BAR_WIDTH = 10
EVENTS_SHOWN = 5
POLL_SECONDS = 1.0
RESOURCE = f"{PLURAL}.{GROUP}"
#: The annotations a user sets to steer a release, shown while they are pending.
REQUESTS = (ABORT_ANNOTATION, PAUSE_ANNOTATION, PROMOTE_ANNOTATION, RETRY_ANNOTATION)
CLEAR_SCREEN = "\x1b[H\x1b[2J"
#: Where ``kubectl gr dashboard`` listens by default (the port Argo Rollouts' dashboard uses too).
DASHBOARD_PORT = 3100


# --- rendering (pure) --------------------------------------------------------------------------------


def progress_bar(current: int, total: int, width: int = BAR_WIDTH) -> str:
    """``[####------] 2/5``: the batches done or live out of all of them (``0/?`` before planning)."""
    if total <= 0:
        return f"[{'-' * width}] {current}/?"
    filled = round(width * min(max(current, 0), total) / total)
    return f"[{'#' * filled}{'-' * (width - filled)}] {current}/{total}"


def age(value: str | None, now: datetime) -> str:
    """kubectl's short age: ``42s``, ``3m10s``, ``5h``, ``2d`` (``-`` when unknown)."""
    then = parse_time(value)
    if then is None:
        return "-"
    seconds = max(0, int((now - then).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 600:
        return f"{seconds // 60}m{seconds % 60}s"
    if seconds < 3 * 3600:
        return f"{seconds // 60}m"
    if seconds < 48 * 3600:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def until(value: str | None, now: datetime) -> str:
    then = parse_time(value)
    if then is None:
        return ""
    seconds = int((then - now).total_seconds())
    return "now" if seconds <= 0 else f"in {seconds}s"


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, float)):
        return f"{value:.4g}"
    return str(value)


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns, the last one unpadded (it holds free text)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [indent + "  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip() for r in rows]


def event_time(event: Obj) -> str:
    """When the event last happened, as its best field gives it."""
    return event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or ""


def _event_order(event: Obj) -> tuple[datetime, datetime]:
    # lastTimestamp has whole seconds; eventTime (kept to the microsecond) orders events of one second.
    never = datetime.min.replace(tzinfo=UTC)
    return (parse_time(event_time(event)) or never, parse_time(event.get("eventTime")) or never)


def last_events(events: Sequence[Obj], n: int = EVENTS_SHOWN) -> list[Obj]:
    """The ``n`` most recent events, oldest first."""
    return sorted(events, key=_event_order)[-n:]


def is_finished(release: Obj) -> bool:
    """A terminal phase the controller reached for the current spec (not the previous release's)."""
    meta = release.get("metadata") or {}
    status = release.get("status") or {}
    current = int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 1)
    return current and status.get("phase") in TERMINAL_PHASES


def _images(items: Any) -> str:
    """``app=web:v2, sidecar=proxy:1``: the images of a template as the status lists them."""
    return ", ".join(f"{i.get('name', '?')}={i.get('image', '?')}" for i in items or []) or "-"


def _template(template: Obj | None, stable: Obj | None) -> str:
    """A template of the status (``held``, ``stable``) as the release's messages name it: by its images and
    the first digits of its digest (:func:`~greyrelease.planner.follow.template_text`); "-" for none."""
    if not template or not template.get("digest"):
        return "-"

    def pairs(t: Obj | None) -> tuple[tuple[str, str], ...]:
        return tuple((str(i.get("name", "?")), str(i.get("image", "?"))) for i in (t or {}).get("images") or [])

    return template_text(str(template["digest"]), pairs(template), pairs(stable))


def _versions(spec: Obj, st: Obj) -> str:
    """Pinned mode: the stable version and the target. Follow mode, where a version is a template's digest:
    the template the pods run and the one held (what a release of it would roll), named by their images."""
    if spec.get("targetVersion"):
        target = st.get("targetVersion") or spec["targetVersion"]
        return f"Versions:    stable {st.get('stableVersion') or '-'} -> target {target}"
    stable, held = st.get("stable"), st.get("held")
    if held and stable and held.get("digest") == stable.get("digest"):
        held = None
    return f"Versions:    stable {_template(stable, None)} -> held {_template(held, stable)}"


def _follow_lines(spec: Obj, st: Obj, now: datetime) -> list[str]:
    """Follow mode (no targetVersion): the template held, the ReplicaSet serving as the stable, whether the
    API server holds new templates (the Held condition, the controller's self-test of the hold) and how
    the last release ended. Nothing in pinned mode."""
    if spec.get("targetVersion"):
        return []
    lines = ["Mode:        follow (every new pod template of the Deployment is released)"]
    held, stable, last = st.get("held"), st.get("stable"), st.get("lastRelease")
    if held:
        since = age(held.get("heldSince"), now)
        lines.append(
            f"Held:        {held.get('digest', '?')} ({_images(held.get('images'))})"
            + (f", held for {since}" if since != "-" else "")
        )
    if stable:
        lines.append(f"Stable:      {stable.get('name', '?')} ({_images(stable.get('images'))})")
    hold = next((c for c in st.get("conditions") or [] if c.get("type") == "Held"), None)
    if hold:
        since = age(hold.get("lastTransitionTime"), now)
        lines.append(
            f"Hold test:   Held={hold.get('status', '?')} ({hold.get('reason') or '-'})"
            + (f" for {since}" if since != "-" else "")
            + (f": {hold['message']}" if hold.get("message") else "")
        )
    if last:
        ended = age(last.get("endedAt"), now)
        lines.append(
            f"Last:        {last.get('outcome', '?')}"
            + (f" {ended} ago" if ended != "-" else "")
            + (f": {last['message']}" if last.get("message") else "")
        )
    return lines


def render_status(release: Obj, events: Sequence[Obj], now: datetime) -> str:
    """What ``kubectl gr status`` prints for a GreyRelease and its events."""
    meta = release.get("metadata") or {}
    spec = release.get("spec") or {}
    st = release.get("status") or {}
    phase = st.get("phase") or "Pending"
    since = age(st.get("phaseStartedAt"), now)
    lines = [
        f"Name:        {meta.get('name', '?')}",
        f"Namespace:   {meta.get('namespace', '?')}",
        f"Phase:       {phase}" + (f" (for {since})" if since != "-" else ""),
        f"Batch:       {progress_bar(int(st.get('currentBatch') or 0), int(st.get('totalBatches') or 0))}",
        f"Weight:      {int(st.get('canaryWeight') or 0)}% to the canary",
        f"Replicas:    canary {int(st.get('canaryReplicas') or 0)}, stable {int(st.get('stableReplicas') or 0)}",
        _versions(spec, st),
    ]
    lines.extend(_follow_lines(spec, st, now))
    if int(st.get("observedGeneration") or 0) < int(meta.get("generation") or 1):
        lines.append("             (the controller has not seen the latest spec yet)")
    if st.get("message"):
        lines.append(f"Message:     {st['message']}")
    times = st.get("batchTimes") or {}
    next_check = until(times.get("nextCheckAt"), now)
    if next_check and phase not in TERMINAL_PHASES:
        lines.append(f"Next check:  {next_check}")
    expires = parse_time(times.get("approvalExpiresAt"))
    if expires is not None and phase not in TERMINAL_PHASES:
        left = max(0, int((expires - now).total_seconds()))
        lines.append(
            f"Approval:    {left // 3600}h{left % 3600 // 60:02d}m{left % 60:02d}s left (until "
            f"{times['approvalExpiresAt']})"
        )
    if st.get("queuePosition"):
        lines.append(f"Queue:       position {st['queuePosition']}")
    annotations = meta.get("annotations") or {}
    pending = [f"{k}={annotations[k]}" for k in REQUESTS if k in annotations]
    if spec.get("paused"):
        pending.append("spec.paused=true")
    if pending:
        lines.append(f"Requested:   {', '.join(pending)}")
    metrics = st.get("metrics") or []
    if metrics:
        lines.append("Metrics:")
        rows: list[tuple[str, ...]] = [("NAME", "VALUE", "STABLE", "VERDICT", "CHECKED", "MESSAGE")]
        for m in metrics:
            rows.append(
                (
                    str(m.get("name", "?")),
                    _number(m.get("value")),
                    _number(m.get("stableValue")),
                    str(m.get("verdict") or "Pending"),
                    age(m.get("checkedAt"), now),
                    str(m.get("message") or ""),
                )
            )
        lines.extend(_table(rows))
    if st.get("awaitingConfirmation") and phase not in TERMINAL_PHASES:
        lines.append(f"Confirm:     waiting for a yes from webhook {st['awaitingConfirmation']}")
    webhooks = st.get("webhooks") or []
    if webhooks:
        lines.append("Webhooks:")
        rows = [("NAME", "AT", "CODE", "VALUE", "VERDICT", "CALLED", "MESSAGE")]
        for w in webhooks:
            rows.append(
                (
                    str(w.get("name", "?")),
                    str(w.get("at") or "-"),
                    str(w.get("code") or "-"),
                    str(w.get("value") or "-"),
                    str(w.get("verdict") or "Pending"),
                    age(w.get("checkedAt"), now),
                    str(w.get("message") or ""),
                )
            )
        lines.extend(_table(rows))
    shown = last_events(events)
    if shown:
        lines.append("Events:")
        rows = [("AGE", "TYPE", "REASON", "MESSAGE")]
        for ev in shown:
            count = int(ev.get("count") or 1)
            message = str(ev.get("message") or "") + (f" (x{count})" if count > 1 else "")
            rows.append((age(event_time(ev), now), str(ev.get("type") or ""), str(ev.get("reason") or ""), message))
        lines.extend(_table(rows))
    return "\n".join(lines) + "\n"


def fingerprint(release: Obj, events: Sequence[Obj]) -> tuple[Any, ...]:
    """Changes exactly when what :func:`render_status` shows changes, apart from ages ticking."""
    meta = release.get("metadata") or {}
    return (
        meta.get("resourceVersion"),
        tuple((e.get("metadata", {}).get("name"), e.get("count"), event_time(e)) for e in last_events(events)),
    )


# --- the cluster -------------------------------------------------------------------------------------


def connect(kubeconfig: str | None, context: str | None) -> tuple[KubeClient, str]:
    """A client with the user's credentials, and the namespace of the chosen context."""
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    cfg = k8s_client.Configuration()
    try:
        # The kubernetes package has no type information: its calls are untyped.
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context, client_configuration=cfg
        )
        contexts, active = k8s_config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except k8s_config.ConfigException:
        sa_namespace = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        if kubeconfig or context or not sa_namespace.exists():
            raise
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return _client(cfg), sa_namespace.read_text().strip() or "default"
    chosen = next((c for c in contexts if c.get("name") == context), active) if context else active
    namespace = ((chosen or {}).get("context") or {}).get("namespace") or "default"
    return _client(cfg), namespace


#: The plugin's User-Agent: its writes (a person's requests) are never the controller's ("greyrelease") in
#: the API server's audit log.
USER_AGENT = "kubectl-gr"


def _client(cfg: Any) -> KubeClient:
    client = KubeClient(cfg)
    client.user_agent = USER_AGENT
    return client


class Api(Kube, Watchable, Protocol):
    """What the plugin asks of the API server: the :class:`Kube` calls, a plain request (a list with a field
    selector) and a watch. :class:`KubeClient` speaks it to a cluster, and MemoryKube in the unit tests."""


class Cluster:
    """The few calls the plugin makes, in one namespace."""

    def __init__(self, kube: Api, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace

    def release(self, name: str) -> Obj:
        found = self.kube.get(path(GROUP, VERSION, PLURAL, self.namespace, name))
        if found is None:
            raise NotFound(404, "NotFound", f'{RESOURCE} "{name}" not found in namespace "{self.namespace}"')
        return found

    def events(self, release: Obj) -> list[Obj]:
        meta = release["metadata"]
        selector = f"involvedObject.name={meta['name']},involvedObject.kind={KIND}"
        found = self.kube.request("GET", path("", "v1", "events", self.namespace), query={"fieldSelector": selector})
        # Events of an earlier object of the same name are not this release's.
        items = found.get("items") or []
        return [e for e in items if e.get("involvedObject", {}).get("uid") in (None, meta.get("uid"))]

    def annotate(self, name: str, annotations: dict[str, str | None]) -> Obj:
        release = path(GROUP, VERSION, PLURAL, self.namespace, name)
        return self.kube.patch(release, {"metadata": {"annotations": annotations}})

    def deployment_replicas(self, doc: Obj) -> int | None:
        spec = doc.get("spec") or {}
        deployments = path("apps", "v1", "deployments", self.namespace)
        if spec.get("targetRef"):
            found = self.kube.get(deployments.named(spec["targetRef"]["name"]))
            matches = [found] if found else []
        else:
            matches = self.kube.list(deployments, label_selector=f"app={spec.get('appName')},!{TRACK_LABEL}")
        return int(matches[0]["spec"].get("replicas", 1)) if len(matches) == 1 else None


# --- commands ----------------------------------------------------------------------------------------


def _now() -> datetime:
    return datetime.now(UTC)


def cmd_status(args: argparse.Namespace, cluster: Cluster, out: TextIO) -> int:
    if not args.watch:
        release = cluster.release(args.name)
        out.write(render_status(release, cluster.events(release), _now()))
        return 0
    tty = out.isatty()
    last: tuple[Any, ...] | None = None
    try:
        while True:
            try:
                release = cluster.release(args.name)
                events = cluster.events(release)
            except NotFound:
                raise
            except (ApiError, HTTPError, OSError) as err:  # a blip of the API server: show it, keep watching
                print(f"warning: {err}", file=sys.stderr)
                time.sleep(args.interval)
                continue
            current = fingerprint(release, events)
            if current != last:
                text = render_status(release, events, _now())
                out.write((CLEAR_SCREEN + text) if tty else (("\n" if last is not None else "") + text))
                out.flush()
                last = current
            if is_finished(release) and not args.keep:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def request_changes(command: str, release: Obj, now: datetime, *, full: bool = False) -> dict[str, str | None]:
    """The annotations a steering command writes on ``release``. Every value a request carries is new
    (``@`` and the time after the word): a follow-mode release never removes its request annotations and
    acts on a value only once, so the same command given twice must write two values. ``promote`` names
    the batch the release is at (the one ``kubectl get gr`` shows as current; batch 1 before the first)."""
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if command == "promote":
        if full:
            return {PROMOTE_ANNOTATION: f"full@{stamp}"}
        batch = int((release.get("status") or {}).get("currentBatch") or 0)
        return {PROMOTE_ANNOTATION: f"{max(batch, 1)}@{stamp}"}
    requests: dict[str, dict[str, str | None]] = {
        "abort": {ABORT_ANNOTATION: f"true@{stamp}"},
        "pause": {PAUSE_ANNOTATION: "true"},
        "resume": {PAUSE_ANNOTATION: None},
        "retry": {RETRY_ANNOTATION: stamp},
    }
    return requests[command]


#: The steering commands, as :func:`steer` takes them (``promote`` with ``full`` for promote=full).
STEERING = ("abort", "pause", "resume", "promote", "retry")


@dataclass(frozen=True)
class Steered:
    """What :func:`steer` wrote, the release as the API server answered the write, and what to tell the user."""

    name: str
    changes: dict[str, str | None]
    release: Obj
    notes: list[str] = field(default_factory=list)

    @property
    def done(self) -> str:
        """``greyrelease.greyrelease.io/web annotated (greyrelease.io/abort=true@...)``: kubectl's words."""
        written = ", ".join(f"{k}={v}" if v is not None else f"{k}-" for k, v in self.changes.items())
        return f"{SINGULAR}.{GROUP}/{self.name} annotated ({written})"


def steer(cluster: Cluster, command: str, name: str, *, full: bool = False) -> Steered:
    """Write the request ``command`` (one of :data:`STEERING`) on the release ``name``, as the user: its
    annotations (:func:`request_changes`) in one merge patch. The API server's refusal (403 for a user who
    may not patch GreyReleases, 404 for a release that is not there) is raised as its :class:`ApiError`,
    and nothing is written then."""
    if command not in STEERING:
        raise ValueError(f"{command!r} is not one of {', '.join(STEERING)}")
    changes = request_changes(command, cluster.release(name), _now(), full=full)
    release = cluster.annotate(name, changes)
    notes = []
    phase = (release.get("status") or {}).get("phase")
    if command == "resume" and (release.get("spec") or {}).get("paused"):
        notes.append("spec.paused is true; the release stays paused until it is set to false")
    if command == "retry" and phase not in ("Aborted", "Failed"):
        notes.append(f"retry restarts an Aborted or Failed release; this one is {phase or 'not started'}")
    return Steered(name, changes, release, notes)


def cmd_annotate(args: argparse.Namespace, cluster: Cluster, out: TextIO) -> int:
    steered = steer(cluster, args.command, args.name, full=getattr(args, "full", False))
    print(steered.done, file=out)
    for note in steered.notes:
        print(f"note: {note}", file=out)
    return 0


def cmd_plan(args: argparse.Namespace, cluster: Cluster | None, out: TextIO) -> int:
    from greyrelease.cli.main import load_release, parse_start, print_plan
    from greyrelease.reconcile.policies import rules_for

    doc = load_release(args.file)
    start = parse_start(args.start)
    rules = None
    if cluster is not None:
        try:
            rules = rules_for(cluster.kube, doc)
        except (ApiError, HTTPError, OSError):
            rules = None  # not allowed to list policies: the spec's own windows only
    replicas = args.replicas
    if replicas is None and cluster is not None:
        namespace = args.namespace or (doc.get("metadata") or {}).get("namespace") or cluster.namespace
        try:
            replicas = Cluster(cluster.kube, namespace).deployment_replicas(doc)
        except (ApiError, HTTPError, OSError):
            replicas = None
    if replicas is None:
        print("error: pass --replicas N (the target Deployment could not be read)", file=sys.stderr)
        return 2
    return print_plan(doc, replicas, out, start=start, rules=rules)


def _parser() -> argparse.ArgumentParser:
    # The connection flags are accepted before or after the subcommand (kubectl users type both).
    def connection(p: argparse.ArgumentParser, default: Any) -> None:
        p.add_argument("-n", "--namespace", default=default, help="the namespace (default: the context's)")
        p.add_argument("--context", default=default, help="the kubeconfig context to use")
        p.add_argument("--kubeconfig", default=default, help="the kubeconfig file to use")

    parser = argparse.ArgumentParser(prog="kubectl gr", description="Inspect and steer GreyReleases.")
    connection(parser, None)
    common = argparse.ArgumentParser(add_help=False)
    connection(common, argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    status = sub.add_parser("status", parents=[common], help="show a release: phase, batches, metrics, events")
    status.add_argument("name")
    status.add_argument("-w", "--watch", action="store_true", help="redraw on every change until it finishes")
    status.add_argument("--keep", action="store_true", help="with -w: keep watching after it finished")
    status.add_argument("--interval", type=float, default=POLL_SECONDS, help=argparse.SUPPRESS)
    for name, text in (
        ("abort", "stop now: all traffic back to stable, the canary removed (greyrelease.io/abort=true@<now>)"),
        ("pause", "hold at the current batch (greyrelease.io/pause=true)"),
        ("resume", "go on after a pause (removes greyrelease.io/pause)"),
        ("retry", "start an Aborted or Failed release again (greyrelease.io/retry=<now>)"),
    ):
        sub.add_parser(name, parents=[common], help=text).add_argument("name")
    promote = sub.add_parser(
        "promote", parents=[common], help="approve the current batch (greyrelease.io/promote=<batch>@<now>)"
    )
    promote.add_argument("name")
    promote.add_argument("--full", action="store_true", help="skip the remaining batches (promote=full@<now>)")
    plan = sub.add_parser("plan", parents=[common], help="show the batches of a GreyRelease file")
    plan.add_argument("-f", "--filename", "--file", dest="file", required=True, help="YAML file ('-' for stdin)")
    plan.add_argument("--replicas", type=int, help="replicas of the target (default: read from the cluster)")
    plan.add_argument("--start", help="when the release would be applied (RFC 3339; default: now)")
    dashboard = sub.add_parser(
        "dashboard",
        parents=[common],
        help="a live web page of the releases (and buttons to steer them), served here with your credentials",
    )
    dashboard.add_argument(
        "-A", "--all-namespaces", action="store_true", help="the releases of every namespace (default: one)"
    )
    dashboard.add_argument(
        "--address", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine only)"
    )
    dashboard.add_argument(
        "--port", type=int, default=DASHBOARD_PORT, help=f"the port (default {DASHBOARD_PORT}; 0: any free port)"
    )
    return parser


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "plan" and args.replicas is not None:
            return cmd_plan(args, None, out)
        try:
            kube, default_namespace = connect(args.kubeconfig, args.context)
        except Exception as err:
            if args.command == "plan":
                return cmd_plan(args, None, out)
            print(f"error: no usable Kubernetes credentials: {err}", file=sys.stderr)
            return 1
        cluster = Cluster(kube, args.namespace or default_namespace)
        if args.command == "status":
            return cmd_status(args, cluster, out)
        if args.command == "plan":
            return cmd_plan(args, cluster, out)
        if args.command == "dashboard":
            from greyrelease.cli.dashboard.server import cmd_dashboard

            return cmd_dashboard(args, cluster, out)
        return cmd_annotate(args, cluster, out)
    except NotFound as err:
        print(f"Error from server (NotFound): {err.message}", file=sys.stderr)
        return 1
    except ApiError as err:
        print(f"Error from server ({err.reason or err.status}): {err.message}", file=sys.stderr)
        return 1
    except (HTTPError, OSError) as err:
        print(f"error: cannot reach the cluster: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
