"""The body of a release event as the controller keeps it: without managedFields, parsed again by orjson
in the dict kopf holds, equal to what the API server sent and smaller."""

from __future__ import annotations

import json
import tracemalloc
from datetime import UTC, datetime, timedelta
from typing import Any

from greyrelease.reconcile.reconciler import Reconciler
from greyrelease.runtime.operator import compact

from tests.support.builders import NS, RELEASE, cluster, roll_out, status_of


def succeeded_release() -> dict[str, Any]:
    """A release driven to Succeeded on the in-memory API server, as JSON text would carry it."""
    kube = cluster(batches=[{"replicas": 1, "pause": "0s"}, {"replicas": 2, "pause": "0s"}, {"replicas": 4}])
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for _ in range(40):
        if status_of(kube).get("phase") == "Succeeded":
            break
        Reconciler(kube).reconcile(NS, "web", now=now)
        roll_out(kube)
        now += timedelta(seconds=5)
    body = kube.get(RELEASE)
    assert body is not None and status_of(kube).get("phase") == "Succeeded"
    body["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
    return body


def test_the_kept_body_is_the_same_dict_equal_to_the_event_s_without_managed_fields() -> None:
    sent = succeeded_release()
    obj = json.loads(json.dumps(sent))  # as kopf parses an event
    held = obj
    compact(obj)
    assert obj is held
    del sent["metadata"]["managedFields"]
    assert obj == sent


def test_bodies_compacted_share_their_keys_and_are_held_in_less_memory() -> None:
    text = json.dumps(succeeded_release())

    def traced(n: int, keep: bool) -> tuple[int, list[dict[str, Any]]]:
        tracemalloc.start()
        try:
            bodies = [json.loads(text) for _ in range(n)]
            for body in bodies if keep else ():
                compact(body)
            return tracemalloc.get_traced_memory()[0], bodies
        finally:
            tracemalloc.stop()

    plain, _ = traced(50, keep=False)
    kept, bodies = traced(50, keep=True)
    a, b = bodies[0]["status"], bodies[1]["status"]
    assert next(iter(a)) is next(iter(b))  # one key string for all the bodies
    print(f"50 bodies of {len(text)} B of JSON: {plain / 50:.0f} B each as parsed, {kept / 50:.0f} B compacted")
    assert kept < plain * 0.85
