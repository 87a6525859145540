"""End-to-end: every case of the hostile-input corpus, applied with kubectl against the shipped CRD."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.controller import Controller, app_manifest, deployment, status, wait_for
from e2e.harness.controlplane import Cluster
from e2e.harness.hostile_inputs import CASES, Case, markdown

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parent.parent


def body(case: Case) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "greyrelease.io/v1",
        "kind": "GreyRelease",
        "metadata": {"name": f"{case.name}-{case.id}"[:253]},
    }
    if case.name != "hostile":
        obj["metadata"]["name"] = case.name
    if case.spec is not None:
        obj["spec"] = case.spec
    return obj


def test_readme_lists_every_case() -> None:
    assert markdown() in (ROOT / "README.md").read_text(), "README table is stale: python -m e2e.harness.hostile_inputs"
    assert len(CASES) >= 40


def test_hostile_inputs_are_refused_or_marked_and_nothing_is_touched(
    cluster: Cluster, namespace: str, controller: Controller
) -> None:
    for name, replicas in (("web", 10), ("odd", 2)):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=app_manifest(name, replicas))
    for name in ("twin-a", "twin-b"):
        manifest = app_manifest(name, 1).split("---")[0].replace(f"app: {name}", "app: twin")
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
    for name in ("web", "odd", "twin-a", "twin-b"):
        cluster.kubectl("rollout", "status", f"deployment/{name}", "-n", namespace, "--timeout=60s")
    before = {
        n: cluster.kubectl_json("get", "deployment", n, "-n", namespace)["spec"] for n in ("web", "twin-a", "twin-b")
    }

    accepted = []
    for case in CASES:
        proc = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body(case)), check=False)
        if case.expect == "refused":
            assert proc.returncode != 0, f"{case.id}: accepted"
            assert case.mentions in proc.stderr, f"{case.id}: {proc.stderr}"
        else:
            assert proc.returncode == 0, f"{case.id}: {proc.stderr}"
            accepted.append(case)

    for case in accepted:
        name = body(case)["metadata"]["name"]
        want = "InvalidSpec" if case.expect == "invalid" else "Failed"

        def marked(name: str = name, want: str = want) -> dict[str, Any] | None:
            s = status(cluster, namespace, name)
            return s if s.get("phase") == want else None

        st = wait_for(marked, 60, f"{case.id} {want}")
        assert case.mentions in st["message"], f"{case.id}: {st['message']}"

    # Nothing the invalid releases name was touched, and no canary exists for them.
    after = {
        n: cluster.kubectl_json("get", "deployment", n, "-n", namespace)["spec"] for n in ("web", "twin-a", "twin-b")
    }
    assert after == before
    for name in ("web-canary", "twin-a-canary", "twin-b-canary", "odd-canary"):
        assert deployment(cluster, namespace, name) is None
    svc = cluster.kubectl_json("get", "service", "web", "-n", namespace)
    assert svc["spec"]["selector"] == {"app": "web"}
