"""Notification receivers: real HTTP servers on the test machine, where the controller (run as a process on
the same machine, e2e/harness/controller.py) posts its notifications, and the Secrets that hold their URLs.

A :class:`Receiver` listens on 127.0.0.1 (a free port of its own), records every POST (when it came, its
body, what it answered) and answers as it is told: 200; 503 to the first ``fail_first`` POSTs of each
notification id and 200 after (a receiver that comes back); or nothing at all, holding the connection
``hang`` seconds before closing it (a receiver that hangs). A notification's id is the generic payload's
``id`` or, in the Slack payload, what follows ``greyrelease · `` in the attachment's footer.

:func:`url_secret` writes the Secret a notification's ``urlSecretRef`` points at.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from e2e.harness.controlplane import Cluster

SLACK_FOOTER = "greyrelease · "


@dataclass(frozen=True)
class Post:
    """One POST a receiver took: when (time.time(), on arrival), its body, and what it answered (0: no
    answer, it hung)."""

    at: float
    path: str
    body: bytes
    status: int

    @property
    def payload(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.body)
        return found

    @property
    def id(self) -> str:
        """The notification's id, from either format."""
        doc = self.payload
        if "id" in doc:
            return str(doc["id"])
        footer = str(((doc.get("attachments") or [{}])[0]).get("footer", ""))
        return footer.removeprefix(SLACK_FOOTER)

    @property
    def reason(self) -> str:
        doc = self.payload
        return str(doc["reason"]) if "reason" in doc else str(doc["attachments"][0]["title"])

    @property
    def answered(self) -> bool:
        return 200 <= self.status < 300


class Receiver:
    """An HTTP server on 127.0.0.1 that takes notifications (see the module's docstring)."""

    def __init__(self, name: str, *, fail_first: int = 0, hang: float = 0.0) -> None:
        self.name = name
        self.fail_first = fail_first
        self.hang = hang
        self._lock = threading.Lock()
        self._posts: list[Post] = []
        self._tries: Counter[str] = Counter()
        self._in_flight = 0
        self._closing = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer._take(self, body)

            def log_message(self, format: str, *args: Any) -> None:  # quiet: the tests print what matters
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"receiver {name}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.name}"

    def start(self) -> Receiver:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()  # the hanging requests end now
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        at = time.time()
        if self.hang:
            with self._lock:
                self._posts.append(Post(at, handler.path, body, 0))
                self._in_flight += 1
            try:
                self._closing.wait(self.hang)
            finally:
                with self._lock:
                    self._in_flight -= 1
            handler.close_connection = True  # closed without an answer
            return
        try:
            key = Post(at, handler.path, body, 0).id
        except (ValueError, KeyError, IndexError, TypeError):
            key = ""
        with self._lock:
            self._tries[key] += 1
            status = 503 if self._tries[key] <= self.fail_first else 200
            self._posts.append(Post(at, handler.path, body, status))
        with contextlib.suppress(OSError):  # the sender gave up on the request already
            handler.send_response(status)
            handler.send_header("Content-Length", "0")
            handler.end_headers()

    # --- what it took ---------------------------------------------------------------------------------

    def posts(self, since: float = 0.0) -> list[Post]:
        """Every POST since ``since`` (time.time()), in the order they came."""
        with self._lock:
            return [p for p in self._posts if p.at >= since]

    def answered(self, since: float = 0.0) -> list[Post]:
        """The POSTs it answered 2xx since ``since``: the notifications delivered."""
        return [p for p in self.posts(since) if p.answered]

    @property
    def in_flight(self) -> int:
        """POSTs being held right now (a hanging receiver)."""
        with self._lock:
            return self._in_flight


def url_secret(cluster: Cluster, namespace: str, name: str, urls: Mapping[str, str]) -> None:
    """Secret ``name`` with one key per URL, applied (so writing it again changes it)."""
    body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": dict(urls)}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))
