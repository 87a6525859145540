"""The hold, as a table: an AdmissionReview in, the JSONPatch and the warnings out. Every row is answered
twice, as a real request and as a dry run, and the two answers must be the same."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from greyrelease.admission import (
    BYPASS_ANNOTATION,
    FIELD_MANAGER,
    HELD_ANNOTATION,
    admit,
    is_held,
    release_patch,
    template_digest,
)
from greyrelease.admission.hold import normal_template

Obj = dict[str, Any]
LABEL = "greyrelease.io/release"
V1 = "registry.example/app:v1"
V2 = "registry.example/app:v2"


def deployment(
    image: str = V1,
    *,
    labels: Obj | None = None,
    annotations: Obj | None = None,
    paused: bool = False,
    replicas: int = 4,
) -> Obj:
    """A Deployment as the API server hands it to a webhook: defaulted."""
    spec: Obj = {
        "replicas": replicas,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {
                "containers": [
                    {
                        "name": "app",
                        "image": image,
                        "imagePullPolicy": "IfNotPresent",
                        "terminationMessagePath": "/dev/termination-log",
                        "resources": {},
                    }
                ],
                "restartPolicy": "Always",
                "dnsPolicy": "ClusterFirst",
                "securityContext": {},
            },
        },
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
    }
    if paused:
        spec["paused"] = True
    meta: Obj = {"name": "web", "namespace": "ns", "labels": {"app": "web", LABEL: "web"} if labels is None else labels}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}


def held(image: str = V1, **kw: Any) -> Obj:
    d = deployment(image, paused=True, **kw)
    d["metadata"].setdefault("annotations", {})[HELD_ANNOTATION] = template_digest(d["spec"]["template"])
    return d


def review(old: Obj, new: Obj, *, dry_run: bool = False, manager: str | None = None, **request: Any) -> Obj:
    req: Obj = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "requestKind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "name": "web",
        "namespace": "ns",
        "operation": "UPDATE",
        "userInfo": {"username": "admin", "groups": ["system:masters"]},
        "object": new,
        "oldObject": old,
        "dryRun": dry_run,
        "options": {
            "kind": "UpdateOptions",
            "apiVersion": "meta.k8s.io/v1",
            **({"fieldManager": manager} if manager else {}),
        },
    }
    req.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def answer(rev: Obj) -> tuple[list[Obj], list[str], str]:
    """(the JSONPatch, the warnings, the decision) of the answer, checked to be the same for a dry run."""
    real = admit(rev)
    dry = copy.deepcopy(rev)
    dry["request"]["dryRun"] = True
    assert admit(dry) == real, "a dry run must get the answer of the real request"
    resp = real["response"]
    assert real["apiVersion"] == "admission.k8s.io/v1" and real["kind"] == "AdmissionReview"
    assert resp["uid"] == rev["request"]["uid"] and resp["allowed"] is True
    patch = json.loads(base64.b64decode(resp["patch"])) if "patch" in resp else []
    assert ("patchType" in resp) == bool(patch)
    return patch, resp.get("warnings", []), resp["auditAnnotations"]["decision"]


def apply(obj: Obj, patch: list[Obj]) -> Obj:
    """A small JSONPatch applier (add and remove on maps): what the API server does with the answer."""
    out = copy.deepcopy(obj)
    for op in patch:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = out
        for p in parents:
            target = target[p]
        if op["op"] == "add":
            target[last] = op["value"]
        elif op["op"] == "remove":
            del target[last]
        elif op["op"] == "test":
            assert target[last] == op["value"]
    return out


def with_(obj: Obj, *changes: Callable[[Obj], object]) -> Obj:
    """A copy of ``obj`` with ``changes`` made to it, in their order."""
    out = copy.deepcopy(obj)
    for change in changes:
        change(out)
    return out


def unpause(d: Obj) -> None:
    d["spec"].pop("paused", None)


def drop_held(d: Obj) -> None:
    d["metadata"]["annotations"].pop(HELD_ANNOTATION, None)


def env(name: str, value: str) -> Callable[[Obj], None]:
    def change(d: Obj) -> None:
        d["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": name, "value": value}]

    return change


HOLD_V2 = "hold"
V2_DIGEST = template_digest(deployment(V2)["spec"]["template"])
V1_DIGEST = template_digest(deployment(V1)["spec"]["template"])

# (id, old, new, fieldManager, decision, the object after the patch: paused?, held digest or None)
CASES: list[tuple[str, Obj, Obj, str | None, str, bool, str | None]] = [
    ("set image on an enrolled Deployment", deployment(), deployment(V2), None, "hold", True, V2_DIGEST),
    (
        "GitOps apply of a new template (argocd-controller)",
        deployment(),
        deployment(V2),
        "argocd-controller",
        "hold",
        True,
        V2_DIGEST,
    ),
    ("a new env var", deployment(), with_(deployment(), env("A", "1")), None, "hold", True, None),
    (
        "rollout restart",
        deployment(),
        with_(
            deployment(),
            lambda d: d["spec"]["template"]["metadata"].update(
                annotations={"kubectl.kubernetes.io/restartedAt": "2026-12-06T10:00:00Z"}
            ),
        ),
        "kubectl-rollout",
        "hold",
        True,
        None,
    ),
    (
        "a newer template while held",
        held(),
        held(V1) | {"spec": deployment(V2, paused=True)["spec"]},
        None,
        "hold",
        True,
        V2_DIGEST,
    ),
    ("kubectl rollout resume while held", held(), with_(held(), unpause), "kubectl-rollout", "rehold", True, V1_DIGEST),
    (
        "a patch removing paused, another manager",
        held(),
        with_(held(), unpause),
        "argocd-server",
        "rehold",
        True,
        V1_DIGEST,
    ),
    (
        "kubectl replace without the annotation nor paused",
        held(),
        with_(held(), unpause, drop_held),
        "kubectl-replace",
        "rehold",
        True,
        V1_DIGEST,
    ),
    (
        "the annotation dropped, still paused",
        held(),
        with_(held(), drop_held),
        "kubectl-edit",
        "rehold",
        True,
        V1_DIGEST,
    ),
    (
        "the annotation changed by hand",
        held(),
        with_(held(), lambda d: d["metadata"]["annotations"].update({HELD_ANNOTATION: "0000"})),
        None,
        "rehold",
        True,
        V1_DIGEST,
    ),
    (
        "the controller's release: both removed, its field manager",
        held(),
        with_(held(), unpause, drop_held),
        FIELD_MANAGER,
        "release",
        False,
        None,
    ),
    (
        "our field manager but the annotation kept: held again",
        held(),
        with_(held(), unpause),
        FIELD_MANAGER,
        "rehold",
        True,
        V1_DIGEST,
    ),
    (
        "our field manager with a new template: held",
        held(),
        with_(deployment(V2), lambda d: d["metadata"].pop("annotations", None)),
        FIELD_MANAGER,
        "hold",
        True,
        V2_DIGEST,
    ),
    ("replicas 0: skipped", deployment(replicas=0), deployment(V2, replicas=0), None, "allow", False, None),
    (
        "bypass: let through",
        deployment(),
        deployment(V2, annotations={BYPASS_ANNOTATION: "true"}),
        None,
        "allow",
        False,
        None,
    ),
    (
        "bypass while held: resume let through",
        held(),
        with_(held(annotations={BYPASS_ANNOTATION: "true"}), unpause),
        "kubectl-rollout",
        "allow",
        False,
        None,
    ),
    (
        'bypass other than "true" holds',
        deployment(),
        deployment(V2, annotations={BYPASS_ANNOTATION: "yes"}),
        None,
        "hold",
        True,
        V2_DIGEST,
    ),
    (
        "not enrolled",
        deployment(labels={"app": "web"}),
        deployment(V2, labels={"app": "web"}),
        None,
        "allow",
        False,
        None,
    ),
    (
        "the canary (track label)",
        deployment(labels={LABEL: "web", "greyrelease.io/track": "canary"}),
        deployment(V2, labels={LABEL: "web", "greyrelease.io/track": "canary"}),
        None,
        "allow",
        False,
        None,
    ),
    ("scale: no template change", deployment(), deployment(replicas=9), None, "allow", False, None),
    (
        "a label edit while held",
        held(),
        held(labels={"app": "web", LABEL: "web", "team": "a"}),
        None,
        "allow",
        True,
        V1_DIGEST,
    ),
    ("already held (a reinvocation)", held(), held(V2), None, "hold", True, V2_DIGEST),
    (
        "defaults only: an empty env list is no change",
        deployment(),
        with_(deployment(), lambda d: d["spec"]["template"]["spec"]["containers"][0].update(env=[], ports=None)),
        None,
        "allow",
        False,
        None,
    ),
    (
        "the pod-template-hash label is no change",
        deployment(),
        with_(
            deployment(), lambda d: d["spec"]["template"]["metadata"]["labels"].update({"pod-template-hash": "5d8f6c"})
        ),
        None,
        "allow",
        False,
        None,
    ),
    (
        "a paused Deployment that is not held, unpaused",
        deployment(paused=True),
        deployment(),
        None,
        "allow",
        False,
        None,
    ),
    (
        "a paused Deployment that is not held gets a new template: held",
        deployment(paused=True),
        deployment(V2, paused=True),
        None,
        "hold",
        True,
        V2_DIGEST,
    ),
]


@pytest.mark.parametrize(
    ("old", "new", "manager", "decision", "paused", "digest"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_the_hold(old: Obj, new: Obj, manager: str | None, decision: str, paused: bool, digest: str | None) -> None:
    patch, warnings, got = answer(review(old, new, manager=manager))
    assert got == decision, (patch, warnings)
    after = apply(new, patch)
    assert bool(after["spec"].get("paused")) is paused
    if decision in ("hold", "rehold"):
        assert is_held(after)
        want = template_digest(new["spec"]["template"])
        assert after["metadata"]["annotations"][HELD_ANNOTATION] == want
        if digest is not None:
            assert want == digest
        assert any("held" in w for w in warnings), warnings
    else:
        assert patch == [] and warnings == []
    if digest is not None and decision != "hold":
        assert (after["metadata"].get("annotations") or {}).get(HELD_ANNOTATION) == digest
    # The template itself is never touched.
    assert after["spec"]["template"] == new["spec"]["template"]
    # What the patch left is a fixed point: answered again (a reinvocation), nothing more to do.
    if patch:
        again, _, _ = answer(review(old, after, manager=manager))
        assert again == []


def test_no_annotations_map_gets_one() -> None:
    new = deployment(V2)
    assert "annotations" not in new["metadata"]
    patch, _, _ = answer(review(deployment(), new))
    assert {"op": "add", "path": "/metadata/annotations", "value": {HELD_ANNOTATION: V2_DIGEST}} in patch
    assert {"op": "add", "path": "/spec/paused", "value": True} in patch


def test_an_existing_annotations_map_gets_a_key() -> None:
    patch, _, _ = answer(review(deployment(), deployment(V2, annotations={"a": "b"})))
    assert {"op": "add", "path": "/metadata/annotations/greyrelease.io~1held", "value": V2_DIGEST} in patch


def test_a_dropped_release_label_is_put_back() -> None:
    new = with_(held(), unpause, drop_held, lambda d: d["metadata"]["labels"].pop(LABEL))
    patch, warnings, decision = answer(review(held(), new, manager="kubectl-replace"))
    assert decision == "rehold"
    after = apply(new, patch)
    assert after["metadata"]["labels"][LABEL] == "web" and is_held(after)
    assert any("greyrelease.io/release was dropped" in w for w in warnings), warnings


def test_a_label_removed_alone_unenrols() -> None:
    """Removing the label is not sent here by the API server (no matchCondition is met); if it were, the
    label is put back only along with a hold."""
    new = with_(deployment(), lambda d: d["metadata"]["labels"].pop(LABEL))
    assert answer(review(deployment(), new)) == ([], [], "allow")


def test_a_manifest_declaring_paused_is_warned_about() -> None:
    ssa = deployment(V2)
    ssa["metadata"]["managedFields"] = [
        {
            "manager": "argocd-controller",
            "operation": "Apply",
            "fieldsV1": {"f:spec": {"f:paused": {}, "f:replicas": {}}},
        },
        {"manager": FIELD_MANAGER, "operation": "Apply", "fieldsV1": {"f:spec": {"f:paused": {}}}},
    ]
    _, warnings, _ = answer(review(deployment(), ssa))
    assert any("declares spec.paused" in w and "argocd-controller" in w for w in warnings), warnings

    csa = deployment(
        V2, annotations={"kubectl.kubernetes.io/last-applied-configuration": json.dumps({"spec": {"paused": False}})}
    )
    _, warnings, _ = answer(review(deployment(), csa))
    assert any("declares spec.paused" in w and "last-applied" in w for w in warnings), warnings


def test_our_own_apply_of_paused_is_not_warned_about() -> None:
    new = deployment(V2)
    new["metadata"]["managedFields"] = [
        {"manager": FIELD_MANAGER, "operation": "Apply", "fieldsV1": {"f:spec": {"f:paused": {}}}}
    ]
    _, warnings, _ = answer(review(deployment(), new))
    assert not any("declares" in w for w in warnings)


def test_warnings_are_short_enough_for_the_api_server() -> None:
    name = "a" * 63
    old = held(labels={LABEL: name})
    old["metadata"]["name"] = name
    new = with_(old, unpause, drop_held, lambda d: d["metadata"]["labels"].pop(LABEL))
    new["metadata"]["managedFields"] = [
        {"manager": "m" * 60, "operation": "Apply", "fieldsV1": {"f:spec": {"f:paused": {}}}}
    ]
    _, warnings, _ = answer(review(old, new))
    assert len(warnings) == 3
    assert all(len(w) <= 256 and w.isprintable() for w in warnings), [len(w) for w in warnings]


@pytest.mark.parametrize(
    "request_change",
    [
        {"operation": "CREATE"},
        {"operation": "DELETE"},
        {"subResource": "scale"},
        {"kind": {"group": "apps", "version": "v1", "kind": "StatefulSet"}},
    ],
    ids=["create", "delete", "scale subresource", "another kind"],
)
def test_other_requests_are_let_through(request_change: Obj) -> None:
    assert answer(review(deployment(), deployment(V2), **request_change)) == ([], [], "allow")


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"apiVersion": "admission.k8s.io/v1beta1", "request": {"uid": "x"}},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
        {"apiVersion": "admission.k8s.io/v1", "request": {"operation": "UPDATE"}},
    ],
)
def test_not_a_review_is_refused(bad: Obj) -> None:
    with pytest.raises(ValueError):
        admit(bad)


def test_digest_ignores_what_the_api_server_ignores() -> None:
    base = deployment()["spec"]["template"]
    same = copy.deepcopy(base)
    same["spec"]["volumes"] = []
    same["metadata"]["annotations"] = {}
    same["metadata"]["labels"]["pod-template-hash"] = "abc"
    assert template_digest(base) == template_digest(same) == V1_DIGEST
    assert template_digest(deployment(V2)["spec"]["template"]) != V1_DIGEST
    assert len(V1_DIGEST) == 16 and int(V1_DIGEST, 16) >= 0


@pytest.mark.parametrize(
    ("template", "normal"),
    [
        ({}, {}),
        ({"metadata": {"labels": {"pod-template-hash": "abc"}}, "spec": {"a": 1}}, {"spec": {"a": 1}}),
        (
            {"metadata": {"labels": {"pod-template-hash": "abc"}, "annotations": {"x": "1"}}},
            {"metadata": {"annotations": {"x": "1"}}},
        ),
        (
            {"metadata": {"labels": {"pod-template-hash": "abc", "app": "web", "gone": None}}},
            {"metadata": {"labels": {"app": "web"}}},
        ),
        ({"metadata": {"labels": {"pod-template-hash": "abc", "gone": None}, "annotations": {}}}, {}),
        (
            {"metadata": None, "spec": {"volumes": [], "containers": [{"name": "app", "env": None}]}},
            {"spec": {"containers": [{"name": "app"}]}},
        ),
    ],
)
def test_a_template_as_the_deployment_controller_compares_it(template: Obj, normal: Obj) -> None:
    given = copy.deepcopy(template)
    assert normal_template(template) == normal
    assert template == given  # the template given is not changed


def test_the_release_patch_lifts_exactly_the_hold() -> None:
    before = held()
    after = apply(before, release_patch(V1_DIGEST))
    assert (
        not is_held(after) and "paused" not in after["spec"] and HELD_ANNOTATION not in after["metadata"]["annotations"]
    )
    assert answer(review(before, after, manager=FIELD_MANAGER)) == ([], [], "release")
    with pytest.raises(AssertionError):  # a newer template held in between: the test operation fails
        apply(held(V2), release_patch(V1_DIGEST))
