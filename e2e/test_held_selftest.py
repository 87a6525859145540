"""End-to-end: the controller's self-test of the hold, shown as the Held condition of a follow-mode release,
on the local API server with kubectl as the other client.

One controller, run from a terminal (``greyrelease run --webhook-port P``: the configuration registered with
a URL on 127.0.0.1) and testing every 5 s. Its dry runs leave the Deployment as it was; the webhook made
unreachable (the configuration's URL moved to a port nobody listens on) turns the condition False with the
API server's message, which names the webhook; the configuration deleted keeps it False for another reason
(the same lastTransitionTime); a restart registers the webhook again and turns it True. A result False is
confirmed four times 15 s apart before it shows: each wait allows for that.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from greyrelease.admission import CONFIGURATION_NAME, WEBHOOK_NAME

from e2e.harness.controller import Controller, apply_release, gr, release, wait_for
from e2e.harness.controlplane import Cluster
from e2e.harness.process import free_port

pytestmark = pytest.mark.e2e

LABEL = "greyrelease.io/release"
IMAGE = "registry.example/app"
#: A False result is shown after four confirmations 15 s apart, the first test within 5 s.
SHOWN_WITHIN = 5 + 4 * 15 + 30


@dataclass
class Env:
    cluster: Cluster
    namespace: str
    port: int
    log: Path
    ctl: Controller | None = None

    def start(self) -> None:
        args = ["--webhook-port", str(self.port), "--held-selftest-seconds", "5"]
        self.ctl = Controller(self.cluster, self.namespace, self.log, extra_args=args)
        self.ctl.start()
        self.ctl.wait_ready()

    def held(self) -> dict[str, Any] | None:
        conditions = (release(self.cluster, self.namespace, "web").get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c.get("type") == "Held"), None)

    def wait_held(self, status: str, reason: str, timeout: float) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            c = self.held()
            return c if c is not None and (c["status"], c["reason"]) == (status, reason) else None

        try:
            return wait_for(found, timeout, f"Held={status} ({reason})", interval=1.0)
        except AssertionError as err:
            logs = self.ctl.logs() if self.ctl is not None else ""
            raise AssertionError(f"{err}; the condition: {self.held()}\n{logs}") from None

    def deployment(self) -> dict[str, Any]:
        return dict(self.cluster.kubectl_json("get", "deployment", "web", "-n", self.namespace))


def manifest() -> str:
    return json.dumps(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app": "web", LABEL: "web"}},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "app", "image": f"{IMAGE}:v1"}]},
                },
            },
        }
    )


@pytest.fixture(scope="module")
def env(cluster: Cluster, crd: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    namespace = f"e2e-held-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", namespace)
    cluster.wait_for_namespace_ready(namespace)
    e = Env(cluster, namespace, free_port(), tmp_path_factory.mktemp("held") / "controller.log")
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest())
        cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=60s")
        e.start()
        apply_release(cluster, namespace, gr("web", targetRef={"name": "web"}, batches=[{"replicas": "100%"}]))
        yield e
    finally:
        if e.ctl is not None:
            e.ctl.stop()
            print(f"--- controller log (last lines) ---\n{e.ctl.logs()}")
        cluster.kubectl("delete", "mutatingwebhookconfiguration", CONFIGURATION_NAME, "--ignore-not-found")
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)


def test_held_true_and_the_dry_runs_leave_the_deployment_as_it_was(env: Env) -> None:
    held = env.wait_held("True", "DryRunHeld", 60)
    assert "Deployment" in held["message"] and "came back held" in held["message"]
    before = env.deployment()
    time.sleep(12)  # two more tests
    after = env.deployment()
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert not after["spec"].get("paused") and "greyrelease.io/selftest" not in json.dumps(after)
    # The result unchanged: the condition is the same, its time of transition too.
    assert env.held() == held


def test_the_webhook_unreachable_is_false_with_the_api_server_s_message(env: Env) -> None:
    dead = free_port()
    patch = [{"op": "replace", "path": "/webhooks/0/clientConfig/url", "value": f"https://127.0.0.1:{dead}/hold"}]
    env.cluster.kubectl(
        "patch", "mutatingwebhookconfiguration", CONFIGURATION_NAME, "--type=json", "-p", json.dumps(patch)
    )
    refused = env.wait_held("False", "WebhookRefused", SHOWN_WITHIN)
    assert f'failed calling webhook "{WEBHOOK_NAME}"' in refused["message"], refused
    print(f"\nHeld=False: {refused['message']}")
    # The configuration gone: still False, for another reason, the transition's time unchanged.
    env.cluster.kubectl("delete", "mutatingwebhookconfiguration", CONFIGURATION_NAME)
    gone = env.wait_held("False", "NoWebhookConfiguration", 30)
    assert gone["lastTransitionTime"] == refused["lastTransitionTime"]


def test_a_restart_registers_the_webhook_again_and_held_is_true(env: Env) -> None:
    assert env.ctl is not None
    env.ctl.stop()
    env.start()
    env.wait_held("True", "DryRunHeld", 60)
