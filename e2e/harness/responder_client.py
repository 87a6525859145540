"""The pod responder (`python -m e2e.harness.responder`) driven from a test over its stdin/stdout protocol,
as the harness drives it, on loopback addresses: no cluster needed."""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import threading
from typing import Any


class ResponderProcess:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "e2e.harness.responder"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def send(self, **command: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def send_raw(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def event(self, timeout: float = 10.0) -> dict[str, Any]:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no event from the responder in {timeout}s") from None

    def serve(self, uid: str, ip: str, port: int, image: str = "registry.example/app:v1", pod: str = "") -> None:
        self.send(op="serve", uid=uid, ip=ip, port=port, pod=pod or f"pod-{uid}", namespace="ns", image=image)
        assert self.event() == {"event": "listening", "uid": uid, "ip": ip, "port": port}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def free_port_at(ip: str) -> int:
    """A free port on the loopback address `ip` (say 127.0.0.2)."""
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])
