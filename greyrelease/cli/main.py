"""The ``greyrelease`` command: run the controller, show a release's plan offline, print the CRD."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from greyrelease.api.release import KIND, GreyReleaseSpec, field_path, parse_time
from greyrelease.planner.batches import MANUAL, PlanError, earliest_finish, expand
from greyrelease.planner.governance import SPEC, Rules, Source, local_text, schedule


def _validation_message(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        lines.append(f"{field_path(tuple(e['loc']))}: {e['msg']}")
    return "\n".join(lines)


def load_release(file: str) -> dict[str, Any]:
    text = sys.stdin.read() if file == "-" else Path(file).read_text()
    for doc in yaml.safe_load_all(text):
        if isinstance(doc, dict) and doc.get("kind") == KIND:
            return doc
    raise SystemExit(f"error: no {KIND} in {file}")


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v) or "0s"


def print_plan(
    doc: dict[str, Any],
    replicas: int,
    out: TextIO = sys.stdout,
    *,
    start: datetime | None = None,
    rules: Rules | None = None,
) -> int:
    """The batches of a release, and when each would start from ``start`` (default now) given its windows
    and freezes (and ``rules``: those of the policies that govern it)."""
    try:
        spec = GreyReleaseSpec.model_validate(doc.get("spec") or {})
        steps = expand(spec, replicas)
    except ValidationError as err:
        print(f"error: {_validation_message(err)}", file=sys.stderr)
        return 2
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    name = doc.get("metadata", {}).get("name", "?")
    routing = spec.traffic_routing
    mode = (
        "replica ratio"
        if routing is None
        else next(
            k
            for k, v in (("service", routing.service), ("nginx", routing.nginx), ("gatewayAPI", routing.gateway_api))
            if v
        )
    )
    what = "every new pod template of its Deployment (follow mode)" if spec.follows else spec.target_version
    print(f"GreyRelease {name}: {what} over {replicas} replicas, traffic by {mode}", file=out)
    if spec.follows:
        share = "" if routing is not None and routing.service is None else ", its traffic canary / (stable + canary)"
        print(f"the stable keeps its replicas; the canary is the share of them now{share}", file=out)
    gates = "-"
    if spec.analysis is not None:
        # Webhooks with the point they are called at (smoke@pre-traffic).
        names = [m.name for m in spec.analysis.metrics] + [f"{w.name}@{w.at}" for w in spec.analysis.webhooks]
        gates = ", ".join(names) or "-"
    begin = start or datetime.now(UTC)
    all_rules = (rules or Rules()).plus(Source(SPEC, tuple(spec.windows or ()), tuple(spec.freezes or ())))
    pauses = [None if s.pause == MANUAL else float(s.pause or 0) for s in steps]
    starts, finish = schedule(pauses, all_rules, begin)
    zone = all_rules.zone()
    # The start column is shown when it can differ from "now plus the pauses": with windows or freezes, or
    # for a given --start.
    timed = start is not None or bool(all_rules)
    width = max(8, *(len(s.pause_label) for s in steps))
    header = f"{'BATCH':<6} {'CANARY':>6} {'STABLE':>6} {'WEIGHT':>6}  {'PAUSE':<{width}} "
    print(header + (f"{'EARLIEST START':<25} " if timed else "") + "GATES", file=out)
    for s, at in zip(steps, starts, strict=True):
        approvals_before = any(p is None for p in pauses[: s.number - 1])
        when = local_text(at, zone) if at is not None else ("after approval" if approvals_before else "never")
        row = f"{s.number:<6} {s.canary_replicas:>6} {s.stable_replicas:>6} {s.weight:>5}%  {s.pause_label:<{width}} "
        print(row + (f"{when:<25} " if timed else "") + gates, file=out)
    if all_rules:
        print(f"windows and freezes: from {local_text(begin, zone)}, each batch starts only when they allow", file=out)
    if not timed:
        finish = None if any(p is None for p in pauses) else begin
    if finish is None:
        manual = sum(1 for s in steps if s.pause == MANUAL)
        if starts[0] is None:
            print("earliest finish: never: no time within a year is open in every window", file=out)
        else:
            print(f"earliest finish: after {manual} manual approval(s)", file=out)
    elif not timed:
        pauses_total = _duration(earliest_finish(steps) or 0.0)
        print(f"earliest finish: {pauses_total} of pauses after the start, plus rollout time", file=out)
    else:
        total = earliest_finish(steps) or 0.0
        print(
            f"earliest finish: {local_text(finish, zone)} ({_duration((finish - begin).total_seconds())} from the "
            f"start, {_duration(total)} of it pauses), plus rollout time",
            file=out,
        )
    return 0


def parse_start(text: str | None) -> datetime | None:
    """``--start``: an RFC 3339 time (``2026-12-07T08:00:00+01:00``); raises SystemExit when unreadable."""
    if text is None:
        return None
    parsed = parse_time(text)
    if parsed is None:
        raise SystemExit(f"error: --start: {text!r} is not an RFC 3339 time such as 2026-12-07T08:00:00+01:00")
    return parsed


def _replicas_from_cluster(doc: dict[str, Any]) -> int | None:
    try:
        from greyrelease.kube.client import KubeClient
        from greyrelease.reconcile.reconciler import deployments_path

        spec = doc.get("spec") or {}
        ns = doc.get("metadata", {}).get("namespace", "default")
        kube = KubeClient.from_environment()
        if spec.get("targetRef"):
            d = kube.get(deployments_path(ns, spec["targetRef"]["name"]))
            found = [d] if d else []
        else:
            found = kube.list(deployments_path(ns), label_selector=f"app={spec.get('appName')}")
        if len(found) == 1:
            return int(found[0]["spec"].get("replicas", 1))
    except Exception:
        return None
    return None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _rules_from_cluster(doc: dict[str, Any]) -> Rules | None:
    try:
        from greyrelease.kube.client import KubeClient
        from greyrelease.reconcile.policies import rules_for

        return rules_for(KubeClient.from_environment(), doc)
    except Exception:
        return None


def cmd_plan(args: argparse.Namespace) -> int:
    doc = load_release(args.file)
    start = parse_start(args.start)
    replicas = args.replicas if args.replicas is not None else _replicas_from_cluster(doc)
    if replicas is None:
        print("error: pass --replicas N (the target Deployment could not be read)", file=sys.stderr)
        return 2
    # With --replicas nothing is read from the cluster: the spec's own windows and freezes only.
    rules = _rules_from_cluster(doc) if args.replicas is None else None
    return print_plan(doc, replicas, start=start, rules=rules)


def cmd_shards(args: argparse.Namespace) -> int:
    """Which shard each namespace falls in, for ``run --shards N``: names that differ only at their end
    hash close together and may share a shard."""
    from greyrelease.runtime.shards import shard_of

    counts = [0] * args.n
    for namespace in args.namespaces:
        k = shard_of(namespace, args.n)
        counts[k] += 1
        print(f"{namespace}\t{k}")
    print("per shard: " + ", ".join(f"{k}: {c}" for k, c in enumerate(counts)), file=sys.stderr)
    return 0


def cmd_crd(args: argparse.Namespace) -> int:
    from greyrelease.api.crd import FILES, render

    if args.output_dir:
        for name in FILES:
            (Path(args.output_dir) / name).write_text(render(name))
        return 0
    sys.stdout.write("---\n".join(render(name) for name in FILES))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import os

    if args.webhook_cert_dir and args.webhook_service:
        print("error: --webhook-cert-dir and --webhook-service: pass one of them", file=sys.stderr)
        return 2
    if not 0 <= args.webhook_port <= 65535:
        print(f"error: --webhook-port {args.webhook_port}: not a port", file=sys.stderr)
        return 2
    if args.held_selftest_seconds < 0:
        print(
            f"error: --held-selftest-seconds {args.held_selftest_seconds:g}: seconds between two tests, or 0 (off)",
            file=sys.stderr,
        )
        return 2
    if not args.resync_seconds > 0:
        print(
            f"error: --resync-seconds {args.resync_seconds:g}: seconds between two looks, more than 0", file=sys.stderr
        )
        return 2
    if not args.full_resync_seconds > 0:
        print(
            f"error: --full-resync-seconds {args.full_resync_seconds:g}: seconds between two full passes, more than 0",
            file=sys.stderr,
        )
        return 2
    if args.shards > 1 and not args.leader_elect:
        print(
            "error: --shards N holds each shard through a Lease: it cannot run with --no-leader-elect", file=sys.stderr
        )
        return 2
    from greyrelease.runtime import collector

    try:
        collector.configure()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # kopf says "Handler ... succeeded" for every watch event of every release; warnings and errors
        # about an object still show, and the controller's own log says what it did.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    if args.metrics_port:
        from greyrelease.reconcile.metrics import serve

        serve(args.metrics_port)
    from greyrelease.runtime.memprofile import enable

    enable()  # only with GREYRELEASE_TRACEMALLOC set: a profiling run
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    import os

    import kopf

    from greyrelease.kube.client import KubeClient
    from greyrelease.kube.retry import ONCE
    from greyrelease.reconcile.held import CONFIRM_SECONDS, HeldSelfTest
    from greyrelease.reconcile.policies import Governing
    from greyrelease.runtime import operator  # noqa: F401 - registers the handlers
    from greyrelease.runtime.controller import Tuning
    from greyrelease.runtime.health import serve as serve_health
    from greyrelease.runtime.leader import Lease, keep, lead, request_timeout

    namespaces = args.namespace or []
    state = {"role": "starting"}
    health = await serve_health(args.health_port, state=state) if args.health_port else None
    lease = None
    lost = asyncio.Event()
    lease_ns = (
        args.leader_election_namespace
        or os.environ.get("POD_NAMESPACE")
        or (namespaces[0] if len(namespaces) == 1 else "greyrelease-system")
    )
    governing = Governing(max_progressing=args.max_progressing, slots_namespace=lease_ns)
    tuning = Tuning(idle_resync=args.resync_seconds, full_resync=args.full_resync_seconds)
    webhook = None
    if args.webhook_port:
        # Served by every replica, before it waits for a Lease: the API server asks any of them.
        from greyrelease.runtime.webhook import start as start_webhook

        try:
            webhook = await start_webhook(
                args.webhook_port,
                cert_dir=args.webhook_cert_dir,
                service=args.webhook_service,
                namespace=args.leader_election_namespace or os.environ.get("POD_NAMESPACE") or "greyrelease-system",
            )
        except (ValueError, OSError) as err:  # flags that do not go together, a port in use, no certificate
            if health is not None:
                await health.cleanup()
            print(f"error: webhook: {err}", file=sys.stderr)
            return 2
        except BaseException:
            if health is not None:
                await health.cleanup()
            raise
    selftest: HeldSelfTest | None = None
    tester: asyncio.Task[None] | None = None
    if args.held_selftest_seconds:
        # Once the webhook is served and registered: one self-test of the hold for the process, which the
        # runtimes take part in once they drive releases (not a standby). Its calls are tried once each:
        # the next test is the retry, and a call retried would only hide a webhook that does not answer.
        from greyrelease.runtime.held import keep_testing

        selftest = HeldSelfTest(
            KubeClient.from_environment(retry=ONCE),
            every=args.held_selftest_seconds,
            confirm_seconds=min(CONFIRM_SECONDS, args.held_selftest_seconds),
        )
        tester = asyncio.create_task(keep_testing(selftest))
    if args.shards > 1:
        from greyrelease.runtime.sharded import run_sharded

        try:
            return await run_sharded(
                n=args.shards,
                namespaces=namespaces,
                governing=governing,
                lease_namespace=lease_ns,
                lease_seconds=args.lease_seconds,
                state=state,
                selftest=selftest,
                tuning=tuning,
            )
        finally:
            if tester is not None:
                tester.cancel()
            if webhook is not None:
                await webhook.stop()
            if health is not None:
                await health.cleanup()
    if args.leader_elect:
        from greyrelease.runtime.shards import live_members

        # The Lease's calls are not retried inside an attempt: the next renewal is the retry (retry.ONCE).
        lease = Lease(
            KubeClient.from_environment(retry=ONCE, timeout=request_timeout(args.lease_seconds)),
            namespace=lease_ns,
            lease_seconds=args.lease_seconds,
        )
        state["role"] = "standby"

        def sharded_alive() -> list[str]:
            try:
                return live_members(lease.kube, lease.namespace)
            except Exception:  # unreachable, or no right to list Leases: nothing seen to wait for
                return []

        # Replicas run with --shards N (a rolling update from them to this one) drive the releases until
        # they are gone; this one waits rather than drive them too.
        while sharded := await asyncio.to_thread(sharded_alive):
            logging.getLogger("greyrelease").info(
                f"waiting for the replicas run with --shards to stop: {', '.join(sharded)}"
            )
            await asyncio.sleep(2.0)
        await lead(lease)
        keeper = asyncio.create_task(keep(lease, lost))
    state["role"] = "leader"
    try:
        await kopf.operator(
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=True,
            stop_flag=lost,
            memo=kopf.Memo(namespaces=namespaces, governing=governing, state=state, held=selftest, tuning=tuning),
        )
    finally:
        if tester is not None:
            tester.cancel()
        if lease is not None:
            keeper.cancel()
            if not lost.is_set():
                await asyncio.to_thread(lease.release)
        if webhook is not None:
            await webhook.stop()
        if health is not None:
            await health.cleanup()
    return 1 if lost.is_set() else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="greyrelease", description="Progressive batch releases for Kubernetes.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the controller against the current kubeconfig")
    run.add_argument("-n", "--namespace", action="append", help="watch only this namespace (repeatable)")
    run.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (the default)")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    run.add_argument("--health-port", type=int, default=0, help="serve /healthz on this port")
    run.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus /metrics on this port")
    run.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="act only while holding the Lease greyrelease-controller (default: on)",
    )
    run.add_argument(
        "--leader-election-namespace",
        help="namespace of the Lease, and of the slots of queues across namespaces (default: $POD_NAMESPACE, "
        "else the one watched namespace, else greyrelease-system)",
    )
    run.add_argument(
        "--lease-seconds",
        type=int,
        default=15,
        help="lease duration (failover bound; 15 s as Kubernetes' own controllers have it)",
    )
    run.add_argument(
        "--shards",
        type=_positive,
        default=1,
        metavar="N",
        help="split the releases by namespace into N shards, each driven by one replica that holds its Lease "
        "(run N or more replicas with the same N; needs the API server's sharded watches, Kubernetes 1.36+ "
        "with the ShardedListAndWatch feature gate); 1, the default, is one active replica and the Lease "
        "greyrelease-controller",
    )
    run.add_argument(
        "--max-progressing",
        type=_positive,
        metavar="K",
        help="at most K releases progress at once in every namespace (a GreyReleasePolicy may set its own); "
        "the others are Queued in order of creation",
    )
    run.add_argument(
        "--webhook-port",
        type=int,
        default=0,
        metavar="PORT",
        help="serve the admission webhook that holds the new pod template of an enrolled Deployment on this port "
        "(HTTPS, every replica; 0, the default: off). With neither of the two flags below (a terminal, an API "
        "server on this host) it listens on 127.0.0.1 with a certificate of its own and registers the "
        "MutatingWebhookConfiguration greyrelease-hold with that URL, left registered on exit",
    )
    run.add_argument(
        "--webhook-cert-dir",
        metavar="DIR",
        help="serve DIR/tls.crt and DIR/tls.key (read again when they change: a mounted Secret, cert-manager); "
        "the configuration's caBundle is left to its owner",
    )
    run.add_argument(
        "--webhook-service",
        metavar="NAME",
        help="the Service in front of the webhook, in the controller's namespace (the install: "
        "greyrelease-webhook): a CA and a certificate for it are kept in the Secret NAME-tls, made by the first "
        "replica, and the CA in the caBundle of greyrelease-hold",
    )
    run.add_argument(
        "--held-selftest-seconds",
        type=float,
        default=300.0,
        metavar="S",
        help="test every S seconds (300 by default) whether the API server holds a new pod template of an "
        "enrolled Deployment (a server-side dry run), as well as at start and before a follow-mode release "
        "starts when the last test is older; shown as the Held condition of follow-mode releases. 0: no test "
        "and no Held condition",
    )
    run.add_argument(
        "--resync-seconds",
        type=float,
        default=900.0,
        metavar="S",
        help="look at every release again at least every S seconds, give or take 10 %% (900 by default; reads from "
        "memory, no write when nothing changed): a net under missed watch events, not how changes are noticed. A "
        "release at rest is passed again only if something its last pass read changed since",
    )
    run.add_argument(
        "--full-resync-seconds",
        type=float,
        default=3600.0,
        metavar="S",
        help="pass every release at rest in full at least every S seconds, give or take 10 %% (3600 by default), "
        "whether or not what it read changed",
    )
    run.add_argument("-v", "--verbose", action="store_true")
    run.set_defaults(func=cmd_run)

    plan = sub.add_parser("plan", help="show the batches of a GreyRelease without a cluster")
    plan.add_argument("-f", "--file", required=True, help="a YAML file with a GreyRelease ('-' for stdin)")
    plan.add_argument(
        "--replicas",
        type=int,
        help="replicas of the target Deployment (given, nothing is read from the cluster: neither the Deployment "
        "nor the GreyReleasePolicies)",
    )
    plan.add_argument("--start", help="when the release would be applied (RFC 3339; default: now)")

    plan.set_defaults(func=cmd_plan)

    shards = sub.add_parser("shards", help="the shard of each namespace under run --shards N")
    shards.add_argument("n", type=_positive, metavar="N", help="the shard count")
    shards.add_argument("namespaces", nargs="+", metavar="NAMESPACE")
    shards.set_defaults(func=cmd_shards)

    crd = sub.add_parser("crd", help="print the CustomResourceDefinitions generated from the models")
    crd.add_argument("-d", "--output-dir", help="write one file per CRD into this directory")
    crd.set_defaults(func=cmd_crd)

    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
