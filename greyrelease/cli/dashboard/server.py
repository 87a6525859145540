"""The dashboard's HTTP server: the page, its data as JSON and as a stream of server-sent events, and the
actions, on aiohttp.

    GET  /                                       the page (static/index.html)
    GET  /static/...                             its script, its styles, the charting library
    GET  /api/releases                           the list of releases
    GET  /api/releases/NS/NAME                   one release's page data
    GET  /api/stream[?release=NS/NAME]           server-sent events: a ``snapshot`` (the list, and the release's
                                                 data when one is named) at once and after each change
    POST /api/releases/NS/NAME/ACTION            abort, pause, resume, promote, promote-full, retry

**Live.** The feed's watches (:mod:`.feed`) call :meth:`Dashboard.changed` on every change the API server
sends; that wakes each open stream (aiohttp-sse's), which sends a new snapshot when what it shows differs from
the last one it sent. Every :data:`KEEPALIVE` seconds an idle stream gets a comment line and reads the release
again (a release window's opening or closing changes no object). The page neither reloads nor polls.

**Actions** are the plugin's own code path: :func:`greyrelease.cli.plugin.steer`, which ``kubectl gr
abort|pause|resume|promote [--full]|retry`` runs, writes the same annotations with the user's credentials.
When the API server refuses (403 for a user who may not patch GreyReleases) the answer carries its status
and its own message, and nothing was written.

**Who may use it.** The server acts with the user's credentials, so another web page open in the same
browser must not be able to make it act. What is chosen here:

- a random token (:func:`secrets.token_urlsafe`, 32 bytes) made at each start and printed in the address
  the command prints; every ``/api/`` request must carry it: the POSTs in the ``X-GreyRelease-Token``
  header only (a form or a link of another site can set no header, and a script of another origin may
  not send one to this origin without a CORS preflight, which is never allowed here), the GETs in the header
  or as ``?token=`` (EventSource can set no header). Compared in constant time.
- a POST with an ``Origin`` header other than the dashboard's own is refused, token or not.
- bound to a loopback address (the default), the ``Host`` header must name that address (or localhost) and
  the port: a page of another site that makes its own name resolve to 127.0.0.1 (DNS rebinding) sends
  its own name and is refused. Bound to another address, any ``Host`` is taken and the token alone guards.
- the page may not be framed (``X-Frame-Options: DENY``, ``frame-ancestors 'none'``), so no other page can
  lay it under its own buttons; it loads nothing from elsewhere (``Content-Security-Policy``) and sends
  no ``Referer`` (the token is in its address).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import ipaddress
import json
import secrets
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web
from aiohttp_sse import EventSourceResponse
from urllib3.exceptions import HTTPError

from greyrelease.cli.dashboard.feed import Feed
from greyrelease.cli.dashboard.views import Key, detail, summaries
from greyrelease.cli.plugin import Api, Cluster, steer
from greyrelease.kube.protocol import ApiError

STATIC = Path(__file__).resolve().parent / "static"
TOKEN_HEADER = "X-GreyRelease-Token"
#: Seconds between the comment lines that keep an idle stream open (aiohttp-sse's pings), and between two
#: readings of an idle release (a release window opens or closes without a change to any object).
KEEPALIVE = 15.0
#: How long a page waits before it opens a broken stream again (the EventSource's ``retry``), in ms.
RETRY_MS = 2000
#: Seconds a stream waits after a wake-up before it reads: a burst of watch events makes one snapshot.
COALESCE = 0.05
#: The buttons, as the plugin's commands: (command, --full).
ACTIONS: dict[str, tuple[str, bool]] = {
    "abort": ("abort", False),
    "pause": ("pause", False),
    "resume": ("resume", False),
    "promote": ("promote", False),
    "promote-full": ("promote", True),
    "retry": ("retry", False),
}
#: Sent with the page.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(code: int, text: str, **extra: Any) -> web.Response:
    """An error answer: ``error`` says it in words (what the page shows), ``extra`` adds fields."""
    return web.json_response({"error": text, **extra}, status=code, headers={"Cache-Control": "no-store"})


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def _host(address: str) -> str:
    """An address as it stands in a URL (an IPv6 address in brackets)."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


class Dashboard:
    """The server's state: the feed, the open streams, the token and the addresses it answers to."""

    def __init__(
        self,
        api: Api,
        namespace: str | None,
        *,
        token: str | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.token = token or secrets.token_urlsafe(32)
        self.clock = clock
        self.feed = Feed(api, namespace, self.changed, clock=clock)
        #: The Host headers taken (None: any; set by :meth:`bind`).
        self.allowed_hosts: set[str] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakers: set[asyncio.Event] = set()
        self._closing = False

    # --- wiring --------------------------------------------------------------------------------------

    def bind(self, address: str, port: int) -> str:
        """Where the server listens: sets the Host headers it answers to; the address to open (with the
        token)."""
        if is_loopback(address):
            names = {_host(address), "127.0.0.1", "localhost", "[::1]"}
            self.allowed_hosts = {f"{n}:{port}" for n in names}
        else:
            self.allowed_hosts = None
        shown = "127.0.0.1" if address in ("0.0.0.0", "") else ("[::1]" if address == "::" else _host(address))
        return f"http://{shown}:{port}/?token={self.token}"

    def changed(self) -> None:
        """Something the page shows changed (called from the watches' threads): wake every stream."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        for wake in self._wakers:
            wake.set()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        app.on_startup.append(self._started)
        app.on_shutdown.append(self._stopping)
        app.router.add_get("/", self._page)
        app.router.add_static("/static/", STATIC)
        app.router.add_get("/api/releases", self._releases)
        app.router.add_get("/api/releases/{namespace}/{name}", self._release)
        app.router.add_get("/api/stream", self._stream)
        app.router.add_post("/api/releases/{namespace}/{name}/{action}", self._act)
        return app

    async def _started(self, _: web.Application) -> None:
        self._loop = asyncio.get_running_loop()

    async def _stopping(self, _: web.Application) -> None:
        self._closing = True
        self._wake_all()

    # --- the guard -----------------------------------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.allowed_hosts is not None and request.host not in self.allowed_hosts:
            return _error(
                403,
                f"Host {request.host!r} is not this dashboard's address ({', '.join(sorted(self.allowed_hosts))}): "
                "a page reaching it under another name is refused",
            )
        if request.path.startswith("/api/"):
            given = request.headers.get(TOKEN_HEADER, "")
            if not given and request.method == "GET":
                given = request.query.get("token", "")
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                where = f"the {TOKEN_HEADER} header" if request.method != "GET" else f"{TOKEN_HEADER} or ?token="
                return _error(
                    403,
                    f"no valid dashboard token in {where}: open the address `kubectl gr dashboard` printed",
                )
            origin = request.headers.get("Origin")
            if request.method != "GET" and origin is not None and origin != f"http://{request.host}":
                return _error(403, f"a request from {origin} is refused: only the dashboard's own page may act")
        return await handler(request)

    # --- reads ---------------------------------------------------------------------------------------

    def _in_scope(self, namespace: str) -> bool:
        return self.namespace is None or namespace == self.namespace

    def snapshot(self, selected: Key | None = None) -> dict[str, Any]:
        """What a page shows: the list, the feeds' errors, and the selected release's data (None when it is
        not there, or not yet listed)."""
        out: dict[str, Any] = {
            "scope": self.namespace or "",
            "synced": self.feed.releases.synced.is_set(),
            "releases": summaries(self.feed.all_releases()),
            "errors": self.feed.errors(),
        }
        if selected is not None:
            out["selected"] = "/".join(selected)
            out["release"] = self.release_data(*selected)
        return out

    def release_data(self, namespace: str, name: str) -> dict[str, Any] | None:
        release = self.feed.release(namespace, name) if self._in_scope(namespace) else None
        if release is None:
            return None
        rules, note = self.feed.rules(release)
        return detail(
            release, self.feed.events_of(namespace), self.feed.history, rules, self.clock(), policies_note=note
        )

    async def _page(self, _: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html", headers=PAGE_HEADERS)

    async def _releases(self, _: web.Request) -> web.Response:
        return web.json_response(self.snapshot(), headers={"Cache-Control": "no-store"})

    async def _release(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        data = self.release_data(namespace, name)
        if data is None:
            return _error(404, self._missing(namespace, name))
        return web.json_response(data, headers={"Cache-Control": "no-store"})

    def _missing(self, namespace: str, name: str) -> str:
        if not self._in_scope(namespace):
            return f"namespace {namespace!r} is not shown by this dashboard (it shows {self.namespace!r}; -A for all)"
        return f'greyreleases.greyrelease.io "{name}" not found in namespace "{namespace}"'

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        selected: Key | None = None
        if "release" in request.query:
            namespace, _, name = request.query["release"].partition("/")
            if not namespace or not name:
                return _error(400, f"release={request.query['release']!r}: name it as NAMESPACE/NAME")
            selected = (namespace, name)
        events = EventSourceResponse(sep="\n", ping_interval=KEEPALIVE)
        await events.prepare(request)
        wake = asyncio.Event()
        self._wakers.add(wake)
        try:
            async with events:
                sent = ""
                while not self._closing and events.is_connected():
                    data = json.dumps(self.snapshot(selected), separators=(",", ":"))
                    if data != sent:
                        await events.send(data, event="snapshot", retry=RETRY_MS if not sent else None)
                        sent = data
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), KEEPALIVE)
                    wake.clear()
                    await asyncio.sleep(COALESCE)
        except ConnectionError:
            pass  # the page went away
        finally:
            self._wakers.discard(wake)
        return events

    # --- actions -------------------------------------------------------------------------------------

    async def _act(self, request: web.Request) -> web.Response:
        namespace, name, action = (request.match_info[k] for k in ("namespace", "name", "action"))
        if action not in ACTIONS:
            return _error(404, f"no action {action!r}: one of {', '.join(ACTIONS)}")
        if not self._in_scope(namespace):
            return _error(404, self._missing(namespace, name))
        command, full = ACTIONS[action]
        cluster = Cluster(self.api, namespace)
        loop = asyncio.get_running_loop()
        try:
            steered = await loop.run_in_executor(None, partial(steer, cluster, command, name, full=full))
        except ApiError as err:
            status = err.status if 400 <= err.status < 600 else 502
            reason = err.reason or str(err.status)
            return _error(
                status,
                f"Error from server ({reason}): {err.message}",
                status=err.status,
                reason=err.reason,
                message=err.message,
            )
        except (HTTPError, OSError) as err:
            return _error(502, f"cannot reach the cluster: {err}")
        return web.json_response(
            {"done": steered.done, "notes": steered.notes, "changes": steered.changes},
            headers={"Cache-Control": "no-store"},
        )


# --- the command ---------------------------------------------------------------------------------------


async def serve(api: Api, namespace: str | None, address: str, port: int, out: TextIO) -> int:
    """Serve the dashboard until SIGINT or SIGTERM; 0 then, 1 when the address cannot be listened on."""
    dashboard = Dashboard(api, namespace)
    runner = web.AppRunner(dashboard.app(), access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, address, port).start()
    except OSError as err:
        await runner.cleanup()
        print(
            f"error: cannot listen on {_host(address)}:{port}: {err.strerror or err} "
            "(--port N for another port, --port 0 for any free one)",
            file=sys.stderr,
        )
        return 1
    bound = int(runner.addresses[0][1])
    url = dashboard.bind(address, bound)
    dashboard.feed.start()
    scope = f"namespace {namespace}" if namespace else "every namespace"
    print(f"GreyRelease dashboard ({scope}): {url}", file=out)
    print("It acts with your credentials: keep the address to yourself. Ctrl-C stops it.", file=out)
    out.flush()
    if not is_loopback(address):
        print(
            f"warning: listening on {address}, not on a loopback address: "
            "whoever reaches it with the token acts as you",
            file=sys.stderr,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread, or no signals
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        dashboard.feed.stop()
        await runner.cleanup()
    return 0


def cmd_dashboard(args: argparse.Namespace, cluster: Cluster, out: TextIO) -> int:
    namespace = None if args.all_namespaces else cluster.namespace
    try:
        return asyncio.run(serve(cluster.kube, namespace, args.address, args.port, out))
    except KeyboardInterrupt:
        return 0
