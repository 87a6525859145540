"""`kubectl gr dashboard`'s server against MemoryKube, with the controller's own reconciler moving the release:
the list, one release's data, the event stream, the actions (the plugin's annotations, the API server's
refusal) and the guard (token, Origin, Host)."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import ClientResponse, ClientSession
from aiohttp.test_utils import TestServer
from greyrelease.cli import plugin
from greyrelease.cli.dashboard import server
from greyrelease.cli.dashboard.server import TOKEN_HEADER, Dashboard
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import ApiError, Ref
from greyrelease.reconcile.policies import POLICIES_PATH
from greyrelease.reconcile.reconciler import Reconciler

from tests.support.builders import NS, RELEASE, T0, cluster, roll_out, status_of

TOKEN = "a-token-for-the-tests"
ROUTED = {"trafficRouting": {"service": {"name": "web"}}}
MANUAL = [{"replicas": 1, "pause": "manual"}, {"replicas": 2, "pause": "manual"}, {"replicas": 4}]


class Running:
    """A dashboard served on 127.0.0.1 (a free port) for one test, and a client session to it."""

    def __init__(self, dashboard: Dashboard, test_server: TestServer, session: ClientSession) -> None:
        self.dashboard, self.server, self.session = dashboard, test_server, session

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.port}{path}"

    async def get(self, path: str, **kwargs: Any) -> ClientResponse:
        return await self.session.get(self.url(path), **kwargs)

    async def json(self, path: str) -> Any:
        resp = await self.get(path, headers={TOKEN_HEADER: TOKEN})
        assert resp.status == 200, await resp.text()
        return await resp.json()

    async def act(self, action: str, name: str = "web", **headers: str) -> ClientResponse:
        return await self.session.post(
            self.url(f"/api/releases/{NS}/{name}/{action}"), headers={TOKEN_HEADER: TOKEN, **headers}
        )


@asynccontextmanager
async def running(kube: MemoryKube, namespace: str | None = NS) -> AsyncIterator[Running]:
    dashboard = Dashboard(kube, namespace, token=TOKEN)
    test_server = TestServer(dashboard.app(), host="127.0.0.1")
    await test_server.start_server()
    dashboard.bind("127.0.0.1", test_server.port or 0)
    dashboard.feed.start()
    assert await asyncio.to_thread(dashboard.feed.wait_synced, 10), "the feed listed nothing"
    session = ClientSession()
    try:
        yield Running(dashboard, test_server, session)
    finally:
        await session.close()
        dashboard.feed.stop()
        kube.end_watches()
        await test_server.close()


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


def until_live(kube: MemoryKube, batch: int, start: datetime = T0) -> datetime:
    reconciler, now = Reconciler(kube), start
    for _ in range(30):
        st = status_of(kube)
        if st.get("currentBatch") == batch and st.get("batchState") == "WaitingForApproval":
            return now
        reconciler.reconcile(NS, "web", now=now)
        roll_out(kube)
        now += timedelta(seconds=1)
    raise AssertionError(f"batch {batch} never waited for approval: {status_of(kube)}")


async def snapshots(resp: ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The ``snapshot`` events of a server-sent event stream, as they come."""
    while True:
        block = (await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 10)).decode()
        fields = dict(line.split(": ", 1) for line in block.strip().splitlines() if ": " in line)
        if fields.get("event") == "snapshot":
            yield json.loads(fields["data"])


# --- reads ---------------------------------------------------------------------------------------------


def test_the_list_and_a_releases_page_data_from_the_api_server() -> None:
    kube = cluster(batches=MANUAL, **ROUTED)
    until_live(kube, 1)

    async def scenario() -> None:
        async with running(kube) as dash:
            listed = await dash.json("/api/releases")
            assert listed["scope"] == NS and listed["errors"] == {}
            [row] = listed["releases"]
            assert (row["name"], row["namespace"], row["phase"], row["batch"], row["batches"], row["weight"]) == (
                "web",
                NS,
                "Progressing",
                1,
                3,
                25,
            )
            assert (row["mode"], row["routing"]) == ("pinned", "service")
            data = await dash.json(f"/api/releases/{NS}/web")
            assert [b["state"] for b in data["batches"]] == ["live", "next", "pending"]
            assert data["traffic"]["weight"][-1] == 25
            assert data["actions"]["promote"] and data["actions"]["abort"] and not data["actions"]["retry"]
            assert "waiting for approval" in data["governance"]["waitingFor"]
            assert any(e["reason"] == "BatchReady" for e in data["events"])
            missing = await dash.get(f"/api/releases/{NS}/nope", headers={TOKEN_HEADER: TOKEN})
            assert missing.status == 404
            assert (await missing.json())[
                "error"
            ] == f'greyreleases.greyrelease.io "nope" not found in namespace "{NS}"'
            elsewhere = await dash.get("/api/releases/other/web", headers={TOKEN_HEADER: TOKEN})
            assert elsewhere.status == 404 and "not shown by this dashboard" in (await elsewhere.json())["error"]

    run(scenario)


def test_the_stream_sends_a_new_snapshot_when_the_release_changes() -> None:
    kube = cluster(batches=MANUAL, **ROUTED)
    now = until_live(kube, 1)

    async def scenario() -> None:
        async with running(kube) as dash:
            resp = await dash.get(f"/api/stream?token={TOKEN}&release={NS}/web")
            assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
            stream = snapshots(resp)
            first = await anext(stream)
            assert first["release"]["summary"]["batch"] == 1 and first["releases"][0]["weight"] == 25
            # The user approves batch 1 (as `kubectl gr promote` does); the controller moves on.
            changed = plugin.request_changes("promote", kube.get(RELEASE) or {}, datetime.now(UTC))
            kube.patch(RELEASE, {"metadata": {"annotations": changed}})
            await asyncio.to_thread(until_live, kube, 2, now)
            seen = first
            while seen["release"]["summary"]["batch"] != 2 or seen["release"]["summary"]["weight"] != 50:
                seen = await anext(stream)
            assert seen["releases"][0]["batch"] == 2
            assert seen["release"]["traffic"]["weight"][-2:] == [25, 50]
            assert [b["state"] for b in seen["release"]["batches"]] == ["done", "live", "next"]
            resp.close()

    run(scenario)


# --- actions -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["abort", "pause", "resume", "promote", "promote-full", "retry"])
def test_each_button_writes_what_kubectl_gr_writes(action: str, monkeypatch: pytest.MonkeyPatch) -> None:
    stamp = datetime(2026, 1, 1, 12, 30, tzinfo=UTC)
    monkeypatch.setattr(plugin, "_now", lambda: stamp)
    by_plugin, by_page = cluster(batches=MANUAL, **ROUTED), cluster(batches=MANUAL, **ROUTED)
    for kube in (by_plugin, by_page):
        until_live(kube, 1)
        if action == "resume":
            kube.patch(RELEASE, {"metadata": {"annotations": {"greyrelease.io/pause": "true"}}})
    before = (by_page.get(RELEASE) or {})["metadata"].get("annotations")
    command, full = server.ACTIONS[action]
    monkeypatch.setattr(plugin, "connect", lambda kubeconfig, context: (by_plugin, NS))
    out = io.StringIO()
    assert plugin.main([command, "web", *(["--full"] if full else [])], out=out) == 0

    async def scenario() -> None:
        async with running(by_page) as dash:
            resp = await dash.act(action)
            assert resp.status == 200, await resp.text()
            answer = await resp.json()
            assert answer["done"] == out.getvalue().splitlines()[0]  # kubectl's words, too

    run(scenario)
    annotations = [(k.get(RELEASE) or {})["metadata"].get("annotations") for k in (by_plugin, by_page)]
    assert annotations[0] == annotations[1]
    assert annotations[1] != before, f"{action} wrote nothing"


def test_an_action_the_api_server_refuses_shows_its_message_and_changes_nothing() -> None:
    kube = cluster(batches=MANUAL, **ROUTED)
    until_live(kube, 1)
    message = (
        'greyreleases.greyrelease.io "web" is forbidden: User "system:serviceaccount:shop:viewer" cannot patch '
        'resource "greyreleases" in API group "greyrelease.io" in the namespace "shop"'
    )

    def read_only(verb: str, ref: Ref) -> None:
        if verb == "PATCH" and ref.resource == "greyreleases":
            raise ApiError(403, "Forbidden", message)

    kube.before = read_only
    before = kube.get(RELEASE)

    async def scenario() -> None:
        async with running(kube) as dash:
            for action in ("abort", "pause", "promote"):
                resp = await dash.act(action)
                assert resp.status == 403
                body = await resp.json()
                assert body["error"] == f"Error from server (Forbidden): {message}"
                assert (body["reason"], body["message"]) == ("Forbidden", message)

    run(scenario)
    assert kube.get(RELEASE) == before  # the same resourceVersion: nothing was written


def test_a_policy_list_the_user_may_not_read_is_said_on_the_page() -> None:
    kube = cluster(batches=MANUAL, **ROUTED)
    until_live(kube, 1)

    def no_policies(verb: str, ref: Ref) -> None:
        if ref.gvr == POLICIES_PATH.gvr:
            raise ApiError(403, "Forbidden", 'greyreleasepolicies.greyrelease.io is forbidden: User "u" cannot list')

    kube.before = no_policies

    async def scenario() -> None:
        async with running(kube) as dash:

            async def note() -> str:
                data = await dash.json(f"/api/releases/{NS}/web")
                return str(data["governance"]["policiesNote"])

            for _ in range(100):
                if await note():
                    break
                await asyncio.sleep(0.05)
            assert await note() == (
                "the GreyReleasePolicies could not be read (Forbidden: greyreleasepolicies.greyrelease.io is "
                'forbidden: User "u" cannot list)'
            )
            assert "policies" in (await dash.json("/api/releases"))["errors"]

    run(scenario)


# --- the guard -----------------------------------------------------------------------------------------


def test_the_guard_refuses_requests_without_the_token_from_another_origin_or_under_another_host() -> None:
    kube = cluster(batches=MANUAL, **ROUTED)
    until_live(kube, 1)
    before = kube.get(RELEASE)

    async def scenario() -> None:
        async with running(kube) as dash:
            port = dash.server.port
            page = await dash.get("/")
            assert page.status == 200 and "text/html" in page.headers["Content-Type"]
            assert page.headers["X-Frame-Options"] == "DENY"
            assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
            assert (await dash.get("/static/uPlot.iife.min.js")).status == 200
            assert (await dash.get("/api/releases")).status == 403
            assert (await dash.get("/api/releases?token=wrong")).status == 403
            assert (await dash.get(f"/api/releases?token={TOKEN}")).status == 200
            refused = [
                # the token in the address does not authorise a write: a link or a form could carry it
                await dash.session.post(dash.url(f"/api/releases/{NS}/web/abort?token={TOKEN}")),
                await dash.act("abort", **{TOKEN_HEADER: "wrong"}),
                await dash.act("abort", Origin="http://attacker.example"),
                await dash.act("abort", Host=f"attacker.example:{port}"),
            ]
            assert [r.status for r in refused] == [403, 403, 403, 403]
            texts = [(await r.json())["error"] for r in refused]
            assert texts[0].startswith(f"no valid dashboard token in the {TOKEN_HEADER} header")
            assert (
                texts[2] == "a request from http://attacker.example is refused: only the dashboard's own page may act"
            )
            assert texts[3].startswith(f"Host 'attacker.example:{port}' is not this dashboard's address")
            rebound = await dash.get(f"/api/releases?token={TOKEN}", headers={"Host": f"attacker.example:{port}"})
            assert rebound.status == 403
            assert (await dash.act("abort", Origin=f"http://127.0.0.1:{port}")).status == 200

    run(scenario)
    assert (kube.get(RELEASE) or {})["metadata"]["annotations"].keys() == {"greyrelease.io/abort"}
    assert before is not None and "annotations" not in before["metadata"]


def test_the_command_listens_on_loopback_and_prints_the_address_with_the_token() -> None:
    kube = cluster(batches=MANUAL, **ROUTED)
    out = io.StringIO()

    async def scenario() -> None:
        task = asyncio.create_task(server.serve(kube, NS, "127.0.0.1", 0, out))
        for _ in range(200):
            if "http://" in out.getvalue() or task.done():
                break
            await asyncio.sleep(0.02)
        first = out.getvalue().splitlines()[0]
        assert first.startswith(f"GreyRelease dashboard (namespace {NS}): http://127.0.0.1:"), first
        url = first.split(": ", 1)[1]
        token = url.split("?token=", 1)[1]
        assert len(token) >= 40
        base = url.split("/?", 1)[0]
        async with ClientSession() as session:
            assert (await session.get(base + "/")).status == 200
            listed = await (await session.get(f"{base}/api/releases", headers={TOKEN_HEADER: token})).json()
            assert listed["scope"] == NS
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        kube.end_watches()

    run(scenario)


def test_the_dashboard_command_line() -> None:
    args = plugin._parser().parse_args(["dashboard", "-A", "--port", "0"])
    assert (args.command, args.all_namespaces, args.address, args.port) == ("dashboard", True, "127.0.0.1", 0)
    args = plugin._parser().parse_args(["-n", "shop", "dashboard"])
    assert (args.namespace, args.all_namespaces, args.port) == ("shop", False, plugin.DASHBOARD_PORT)


def test_every_namespace_with_all_namespaces() -> None:
    kube = cluster(batches=MANUAL, **ROUTED)
    other = {**(kube.get(RELEASE) or {}), "status": {"phase": "Succeeded", "canaryWeight": 0}}
    other["metadata"] = {"name": "api", "namespace": "payments"}
    kube.put(other)

    async def scenario() -> None:
        async with running(kube, namespace=None) as dash:
            listed = await dash.json("/api/releases")
            assert listed["scope"] == ""
            assert [(r["namespace"], r["name"], r["phase"]) for r in listed["releases"]] == [
                ("payments", "api", "Succeeded"),
                (NS, "web", "Pending"),
            ]
            assert (await dash.json("/api/releases/payments/api"))["actions"]["abort"] is False

    run(scenario)
