"""JSON patches (RFC 6902) and the field manager of a patch: applied by the in-memory API server as the real
one applies them, and sent by the client with their content type and the ``fieldManager`` query parameter.
The controller lifts the admission webhook's hold this way (:func:`greyrelease.admission.release_patch`).
A dry-run patch (``dryRun=All``, the hold's self-test) is admitted and answered, and stores nothing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from greyrelease.admission import FIELD_MANAGER, HELD_ANNOTATION, release_patch
from greyrelease.api.release import Obj
from greyrelease.kube.cache import CachedKube, Store
from greyrelease.kube.client import KubeClient
from greyrelease.kube.memory import MemoryKube, PatchError, json_patch
from greyrelease.kube.protocol import JSON_PATCH, MERGE, ApiError, path
from kubernetes import client as k8s_client

WEB = path("apps", "v1", "deployments", "shop", "web")


def held(digest: str = "abc") -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop", "annotations": {HELD_ANNOTATION: digest, "keep": "me"}},
        "spec": {"paused": True, "replicas": 3, "template": {"spec": {"containers": [{"name": "app"}]}}},
        "status": {"replicas": 3},
    }


@pytest.mark.parametrize(
    ("operations", "expected"),
    [
        ([{"op": "add", "path": "/a/b", "value": 1}], {"a": {"b": 1}, "l": [1, 2]}),
        ([{"op": "add", "path": "/l/1", "value": 9}], {"a": {}, "l": [1, 9, 2]}),
        ([{"op": "add", "path": "/l/-", "value": 3}], {"a": {}, "l": [1, 2, 3]}),
        ([{"op": "remove", "path": "/l/0"}], {"a": {}, "l": [2]}),
        ([{"op": "replace", "path": "/l/0", "value": 5}], {"a": {}, "l": [5, 2]}),
        ([{"op": "move", "from": "/l", "path": "/a/l"}], {"a": {"l": [1, 2]}}),
        ([{"op": "copy", "from": "/l/1", "path": "/a/x"}], {"a": {"x": 2}, "l": [1, 2]}),
        ([{"op": "test", "path": "/l", "value": [1, 2]}, {"op": "remove", "path": "/a"}], {"l": [1, 2]}),
        ([{"op": "add", "path": "/a/x~1y~0z", "value": "k"}], {"a": {"x/y~z": "k"}, "l": [1, 2]}),
    ],
    ids=["add-key", "add-index", "add-end", "remove", "replace", "move", "copy", "test-then-remove", "escaped"],
)
def test_each_operation_applies_as_rfc_6902_says(operations: list[Obj], expected: Obj) -> None:
    doc: Obj = {"a": {}, "l": [1, 2]}
    assert json_patch(doc, operations) == expected
    assert doc == {"a": {}, "l": [1, 2]}  # the target is not changed in place


@pytest.mark.parametrize(
    "operations",
    [
        [{"op": "remove", "path": "/missing"}],
        [{"op": "replace", "path": "/a/missing", "value": 1}],
        [{"op": "add", "path": "/missing/b", "value": 1}],
        [{"op": "test", "path": "/l/0", "value": 7}],
        [{"op": "remove", "path": "/a"}, {"op": "test", "path": "/l", "value": []}],
        [{"op": "frobnicate", "path": "/a"}],
    ],
    ids=[
        "remove-missing",
        "replace-missing",
        "add-under-missing",
        "test-fails",
        "test-fails-after-a-change",
        "unknown",
    ],
)
def test_a_patch_that_cannot_apply_is_refused_whole(operations: list[Obj]) -> None:
    with pytest.raises(PatchError):
        json_patch({"a": {}, "l": [1, 2]}, operations)


def test_the_hold_is_lifted_by_the_release_patch_under_the_controllers_field_manager() -> None:
    kube = MemoryKube(held("abc"))
    before = kube.get(WEB) or {}
    out = kube.patch(WEB, release_patch("abc"), patch_type=JSON_PATCH, field_manager=FIELD_MANAGER)
    assert "paused" not in out["spec"] and out["metadata"]["annotations"] == {"keep": "me"}
    assert out["spec"]["template"] == before["spec"]["template"] and out["status"] == before["status"]
    assert out["metadata"]["generation"] == before["metadata"]["generation"] + 1  # spec.paused changed
    assert kube.managers == [(WEB, JSON_PATCH, FIELD_MANAGER)]


def test_a_release_patch_for_a_template_no_longer_held_is_refused_with_422_and_changes_nothing() -> None:
    kube = MemoryKube(held("newer"))
    before = kube.get(WEB)
    with pytest.raises(ApiError) as err:
        kube.patch(WEB, release_patch("abc"), patch_type=JSON_PATCH, field_manager=FIELD_MANAGER)
    assert err.value.status == 422
    assert kube.get(WEB) == before


def test_a_json_patch_of_the_status_subresource_changes_only_the_status() -> None:
    kube = MemoryKube(held())
    out = kube.patch(
        WEB.sub("status"), [{"op": "replace", "path": "/status/replicas", "value": 4}], patch_type=JSON_PATCH
    )
    assert out["status"] == {"replicas": 4} and out["spec"]["paused"] is True


def test_the_cache_passes_the_field_manager_on_and_folds_the_answer_in() -> None:
    inner = MemoryKube(held())
    kube = CachedKube(inner)
    kube.patch(WEB, {"metadata": {"labels": {"x": "y"}}}, field_manager=FIELD_MANAGER)
    assert inner.managers == [(WEB, MERGE, FIELD_MANAGER)]


def test_a_dry_run_patch_is_admitted_and_answered_and_stores_nothing() -> None:
    kube = MemoryKube(held())
    admitted: list[Obj] = []

    def admit(obj: Obj) -> Obj:  # a mutating webhook in front of the Deployments
        admitted.append(obj)
        return {**obj, "metadata": {**obj["metadata"], "labels": {"admitted": "yes"}}}

    kube.admit = admit
    before = kube.get(WEB)
    answer = kube.patch(WEB, {"spec": {"template": {"metadata": {"annotations": {"n": "1"}}}}}, dry_run=True)
    assert answer["metadata"]["labels"] == {"admitted": "yes"} and len(admitted) == 1
    assert answer["spec"]["template"]["metadata"] == {"annotations": {"n": "1"}}
    assert answer["metadata"]["resourceVersion"] == (before or {})["metadata"]["resourceVersion"]
    assert kube.get(WEB) == before  # nothing stored
    assert kube.writes == [] and (MemoryKube.DRY_RUN, WEB) in kube.requests
    # A JSON patch too; and an admission hook that raises is the API server's answer.
    answer = kube.patch(WEB, [{"op": "remove", "path": "/spec/paused"}], patch_type=JSON_PATCH, dry_run=True)
    assert "paused" not in answer["spec"] and kube.get(WEB) == before

    def down(obj: Obj) -> Obj:
        raise ApiError(500, "InternalError", 'failed calling webhook "hold.deployments.greyrelease.io"')

    kube.admit = down
    with pytest.raises(ApiError, match="failed calling webhook"):
        kube.patch(WEB, {"spec": {"replicas": 1}}, dry_run=True)
    assert kube.get(WEB) == before and kube.writes == []


def test_the_cache_neither_folds_a_dry_run_answer_in_nor_asks_whether_it_may_write() -> None:
    inner = MemoryKube(held())
    kube = CachedKube(inner, writable=lambda: False)
    store = Store(packed=True)
    kube.cache(path("apps", "v1", "deployments"), store)
    kube.get(WEB)  # held in memory now
    answer = kube.patch(WEB, {"spec": {"replicas": 9}}, dry_run=True)
    assert answer["spec"]["replicas"] == 9
    assert (store.get("shop", "web") or {})["spec"]["replicas"] == 3
    assert inner.requests[-1] == (MemoryKube.DRY_RUN, WEB)


class Recorder:
    """An HTTP server on localhost that answers every request with ``{}`` and keeps what it was sent."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, Any]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_PATCH(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                recorder.seen.append((self.command, self.path, self.headers.get("Content-Type", ""), body))
                data = b"{}"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.close()


def test_the_client_sends_a_json_patch_with_its_content_type_and_field_manager(recorder: Recorder) -> None:
    kube = KubeClient(k8s_client.Configuration(host=recorder.url))
    kube.patch(WEB, release_patch("abc"), patch_type=JSON_PATCH, field_manager=FIELD_MANAGER)
    kube.patch(WEB, {"metadata": {"labels": {"a": "b"}}})
    (verb, sent, content_type, body), (_, plain, merge_type, _) = recorder.seen
    assert (verb, sent, content_type) == (
        "PATCH",
        "/apis/apps/v1/namespaces/shop/deployments/web?fieldManager=greyrelease",
        JSON_PATCH,
    )
    assert body == release_patch("abc")
    assert (plain, merge_type) == ("/apis/apps/v1/namespaces/shop/deployments/web", MERGE)


def test_the_client_sends_a_dry_run_as_dry_run_all(recorder: Recorder) -> None:
    kube = KubeClient(k8s_client.Configuration(host=recorder.url))
    kube.patch(WEB, {"spec": {"replicas": 1}}, dry_run=True)
    kube.patch(WEB, {"spec": {"replicas": 1}}, field_manager=FIELD_MANAGER, dry_run=True)
    assert [sent for _, sent, _, _ in recorder.seen] == [
        "/apis/apps/v1/namespaces/shop/deployments/web?dryRun=All",
        "/apis/apps/v1/namespaces/shop/deployments/web?fieldManager=greyrelease&dryRun=All",
    ]
