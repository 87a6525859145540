"""``/healthz`` for the kubelet: answers while the process and its event loop are alive, for the leader
and for a standby waiting for the Lease alike (a standby is healthy; it must not be restarted for
waiting)."""

from __future__ import annotations

from aiohttp import web


async def serve(port: int, *, state: dict[str, str]) -> web.AppRunner:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text=f"ok ({state.get('role', 'starting')})\n")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner
