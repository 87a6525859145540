"""``/healthz`` for the kubelet: answers while the process and its event loop are alive, for the leader
and for a standby waiting for the Lease alike (a standby is healthy; it must not be restarted for
waiting). ``/readyz`` answers 200 once the controller reconciles (its startup is done: the Deployment
and Service watches have listed), 503 before that and on a standby."""

from __future__ import annotations

from aiohttp import web


async def serve(port: int, *, state: dict[str, str]) -> web.AppRunner:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text=f"ok ({state.get('role', 'starting')})\n")

    async def readyz(_: web.Request) -> web.Response:
        if state.get("ready"):
            return web.Response(text=f"ready ({state.get('role', 'starting')})\n")
        return web.Response(status=503, text=f"not ready ({state.get('role', 'starting')})\n")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner
