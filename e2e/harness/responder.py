"""Pod responders: HTTP servers that answer as the simulated pods, one listener per pod IP and port.

    python -m e2e.harness.responder

Driven by JSON lines on stdin, reporting JSON lines on stdout (one object per line, flushed):

    {"op": "serve", "uid", "ip", "port", "pod", "namespace", "image"}
        listen on ip:port and answer as that pod -> {"event": "listening", "uid", "ip", "port"}
        A serve for an ip:port that another uid holds stops that one at once first, closing its open
        connections too ({"event": "stopped"} for it): pod IPs are reused, and an old pod must never answer
        at a new pod's address, not even on a keep-alive connection the proxy kept. A serve repeated for a
        uid already listening there only repeats "listening".
    {"op": "stop", "uid", "after": seconds}
        the pod was deleted: keep answering for `after` seconds (its termination grace period) with
        `Connection: close` on every answer, as a draining server does, then close the listener and every
        open connection, requests in flight included, as a container killed at the end of its grace period
        -> {"event": "stopped", "uid"}. A stop for a uid not served answers "stopped" at once (stopping is
        idempotent); a second stop keeps the earlier deadline.
    stdin at its end: everything stops at once, exit status 0.
    Anything wrong with a command -> {"event": "error", "uid", "message"}, and the responder goes on.

Every pod answers any method on any path with a JSON body: pod, namespace, image, uid, ip, port, status.
What it does comes from the image reference's tag (e.g. `registry.example/app:v3-err30`):
    `-errNN`      NN% of the answers (0..100) are 500: each pod counts its requests and fails request n when
                  floor(n*NN/100) steps, so any 100 consecutive requests hold exactly NN errors (a stable
                  share, unlike a coin toss).
    `-slowNNNms`  each answer waits NNN ms first.
Both may combine, in either order (`v3-slow300ms-err10`). Requests that are not HTTP get aiohttp's 400 and the
connection is closed; the process goes on.

Built on aiohttp's server (already a dependency through kopf): one AppRunner per pod, so closing a pod
closes exactly its listener and its connections (`AppRunner.cleanup()` closes the listener, then idle
connections, then cancels requests in flight after the shutdown timeout). Keep-alive connections stay open
for 120 s, longer than a proxy's idle timeout (Traefik: 90 s), so it is the proxy that retires an idle
connection and never races a request against the server closing it.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
import threading
from dataclasses import dataclass
from typing import Any

from aiohttp import web

KEEPALIVE_SECONDS = 120.0
# The shutdown timeout for requests in flight when a pod is closed: none get more time (a killed container
# answers nothing more). aiohttp reads a timeout <= 0 as "no timeout", hence a tiny positive one.
KILL_TIMEOUT = 0.001

_ERR = re.compile(r"-err(\d+)$")
_SLOW = re.compile(r"-slow(\d+)ms$")


@dataclass(frozen=True)
class Behaviour:
    error_percent: int = 0
    delay_seconds: float = 0.0


def image_tag(image: str) -> str:
    """'registry.example:5000/app:v2-err30@sha256:...' -> 'v2-err30'; '' when the reference has no tag."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.rsplit(":", 1)[1] if ":" in last else ""


def behaviour_from_image(image: str) -> Behaviour:
    """The behaviour a tag asks for: 'v3-err30' -> 30% errors, 'v3-slow300ms' -> 0.3 s delay, both combine.
    Raises ValueError (naming `image`) for an error percentage over 100."""
    tag = image_tag(image)
    error_percent, delay_ms = 0, 0
    while True:
        if m := _ERR.search(tag):
            error_percent = int(m.group(1))
        elif m := _SLOW.search(tag):
            delay_ms = int(m.group(1))
        else:
            break
        tag = tag[: m.start()]
    if error_percent > 100:
        raise ValueError(f"image {image!r}: -err{error_percent} asks for more than 100% errors")
    return Behaviour(error_percent=error_percent, delay_seconds=delay_ms / 1000)


def fails(n: int, error_percent: int) -> bool:
    """Whether request n (0, 1, 2, ...) of a pod answers 500: spread evenly, exactly error_percent in any 100
    consecutive requests (the Bresenham pattern: 30% fails requests 3, 6, 9, 13, ...)."""
    return math.floor((n + 1) * error_percent / 100) > math.floor(n * error_percent / 100)


@dataclass(frozen=True)
class PodSpec:
    uid: str
    ip: str
    port: int
    pod: str
    namespace: str
    image: str

    @classmethod
    def from_command(cls, command: dict[str, Any]) -> PodSpec:
        """Raises ValueError naming the missing or wrong field."""
        values: dict[str, Any] = {}
        for field in ("uid", "ip", "pod", "namespace", "image"):
            value = command.get(field)
            if not isinstance(value, str) or not value:
                raise ValueError(f"serve: field {field!r} must be a non-empty string, got {value!r}")
            values[field] = value
        port = command.get("port")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ValueError(f"serve: field 'port' must be an integer 1..65535, got {port!r}")
        return cls(port=port, **values)


class Pod:
    """One pod's listener and the connections it accepted."""

    def __init__(self, spec: PodSpec) -> None:
        self.spec = spec
        self.behaviour = behaviour_from_image(spec.image)
        self.requests = 0
        self.draining = False
        self.deadline_task: asyncio.Task[None] | None = None
        self._closing: asyncio.Task[None] | None = None
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self.answer)
        self.runner = web.AppRunner(
            app, access_log=None, keepalive_timeout=KEEPALIVE_SECONDS, shutdown_timeout=KILL_TIMEOUT
        )

    @property
    def address(self) -> tuple[str, int]:
        return (self.spec.ip, self.spec.port)

    async def start(self) -> None:
        await self.runner.setup()
        try:
            await web.TCPSite(self.runner, self.spec.ip, self.spec.port, reuse_address=True).start()
        except BaseException:
            await self.runner.cleanup()
            raise

    async def answer(self, request: web.Request) -> web.Response:
        n = self.requests
        self.requests += 1
        if request.body_exists:
            await request.read()
        if self.behaviour.delay_seconds:
            await asyncio.sleep(self.behaviour.delay_seconds)
        status = 500 if fails(n, self.behaviour.error_percent) else 200
        s = self.spec
        body = {
            "pod": s.pod,
            "namespace": s.namespace,
            "image": s.image,
            "uid": s.uid,
            "ip": s.ip,
            "port": s.port,
            "status": status,
        }
        response = web.json_response(body, status=status)
        if self.draining:
            response.force_close()  # Connection: close: the proxy opens no more requests on this connection
        return response

    async def close(self) -> None:
        """Close the listener and every connection, requests in flight included. Idempotent; concurrent
        callers all wait for the same close."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self.runner.cleanup())
        await asyncio.shield(self._closing)


class Responder:
    """The pods being served, by uid and by address; commands run one at a time, in order."""

    def __init__(self) -> None:
        self.by_uid: dict[str, Pod] = {}
        self.by_address: dict[tuple[str, int], Pod] = {}

    @staticmethod
    def emit(event: str, **fields: Any) -> None:
        sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
        sys.stdout.flush()

    async def handle(self, line: str) -> None:
        uid: Any = None
        try:
            command = json.loads(line)
            if not isinstance(command, dict):
                raise ValueError(f"a command is a JSON object, got {line.strip()!r}")
            uid = command.get("uid")
            op = command.get("op")
            if op == "serve":
                await self.serve(PodSpec.from_command(command))
            elif op == "stop":
                if not isinstance(uid, str) or not uid:
                    raise ValueError(f"stop: field 'uid' must be a non-empty string, got {uid!r}")
                after = command.get("after", 0)
                if not isinstance(after, int | float) or isinstance(after, bool) or after < 0:
                    raise ValueError(f"stop: field 'after' must be a number of seconds >= 0, got {after!r}")
                await self.stop(uid, float(after))
            else:
                raise ValueError(f"field 'op' must be 'serve' or 'stop', got {op!r}")
        except Exception as exc:  # one bad command (or an address already taken) must not stop the other pods
            message = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            self.emit("error", uid=uid, message=message)

    async def serve(self, spec: PodSpec) -> None:
        current = self.by_uid.get(spec.uid)
        if current is not None and current.spec == spec and not current.draining:
            self.emit("listening", uid=spec.uid, ip=spec.ip, port=spec.port)
            return
        pod = Pod(spec)  # ValueError for a bad image tag, before anything is closed or bound
        if current is not None:
            await self.finish(current)  # the same uid at another address or image: started afresh
        holder = self.by_address.get((spec.ip, spec.port))
        if holder is not None:
            await self.finish(holder)
        await pod.start()  # OSError when the address cannot be bound: reported as an error event
        self.by_uid[spec.uid] = pod
        self.by_address[pod.address] = pod
        self.emit("listening", uid=spec.uid, ip=spec.ip, port=spec.port)

    async def stop(self, uid: str, after: float) -> None:
        pod = self.by_uid.get(uid)
        if pod is None:
            self.emit("stopped", uid=uid)
            return
        if pod.deadline_task is not None:
            return  # already draining: the earlier deadline holds
        pod.draining = True
        pod.deadline_task = asyncio.ensure_future(self._finish_after(pod, after))

    async def _finish_after(self, pod: Pod, after: float) -> None:
        await asyncio.sleep(after)
        await self.finish(pod, from_deadline=True)

    async def finish(self, pod: Pod, *, from_deadline: bool = False) -> None:
        """Close a pod now and forget it; "stopped" once it no longer answers."""
        if self.by_uid.get(pod.spec.uid) is not pod:
            await pod.close()  # being finished by someone else: wait until it is
            return
        del self.by_uid[pod.spec.uid]
        del self.by_address[pod.address]
        if pod.deadline_task is not None and not from_deadline:
            pod.deadline_task.cancel()
        await pod.close()
        self.emit("stopped", uid=pod.spec.uid)

    async def close_all(self) -> None:
        await asyncio.gather(*(self.finish(pod) for pod in list(self.by_uid.values())))


def _read_stdin(loop: asyncio.AbstractEventLoop, lines: asyncio.Queue[str | None]) -> None:
    # A thread and blocking reads: works whatever stdin is (pipe, file, terminal), which
    # loop.connect_read_pipe() does not (regular files).
    for line in sys.stdin:
        loop.call_soon_threadsafe(lines.put_nowait, line)
    loop.call_soon_threadsafe(lines.put_nowait, None)


async def run() -> None:
    responder = Responder()
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    threading.Thread(target=_read_stdin, args=(asyncio.get_running_loop(), lines), daemon=True).start()
    try:
        while (line := await lines.get()) is not None:
            if line.strip():
                await responder.handle(line)
    finally:
        await responder.close_all()


def main() -> int:
    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
