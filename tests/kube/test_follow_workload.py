"""What follow mode reads of a Deployment and its ReplicaSet, and the canary it builds from the held
template: pure functions of :mod:`greyrelease.kube.workload`."""

from __future__ import annotations

import copy

from greyrelease.admission.hold import HELD_ANNOTATION, template_digest
from greyrelease.api.release import RELEASE_LABEL, TRACK_LABEL, VERSION_LABEL, Obj
from greyrelease.kube.workload import (
    REVISION_ANNOTATION,
    SOURCE_ANNOTATION,
    build_template_canary,
    canary_patch,
    current_replicaset,
    enrol_patch,
    holds,
    replicaset_of,
    unenrol_patch,
    workload_of,
)

RELEASE: Obj = {"metadata": {"name": "web", "namespace": "shop", "uid": "release-uid"}}


def held_deployment() -> Obj:
    template = {
        "metadata": {"labels": {"app": "web", "app.kubernetes.io/instance": "shop-web"}},
        "spec": {
            "containers": [
                {"name": "app", "image": "app:v2", "env": [{"name": "FLAG", "value": "off"}]},
                {"name": "proxy", "image": "proxy:1", "envFrom": [{"configMapRef": {"name": "proxy-3f9"}}]},
            ]
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "uid": "web-uid",
            "labels": {
                "app": "web",
                "app.kubernetes.io/instance": "shop-web",
                "kustomize.toolkit.fluxcd.io/name": "apps",
                RELEASE_LABEL: "web",
            },
            "annotations": {
                HELD_ANNOTATION: template_digest(template),
                REVISION_ANNOTATION: "3",
                "argocd.argoproj.io/tracking-id": "shop:apps/Deployment:shop/web",
            },
        },
        "spec": {
            "paused": True,
            "replicas": 6,
            "selector": {"matchLabels": {"app": "web"}},
            "template": template,
            "strategy": {"rollingUpdate": {"maxSurge": 1}},
        },
        "status": {"observedGeneration": 4, "replicas": 6, "updatedReplicas": 0, "readyReplicas": 6},
    }


def stable_replicaset(revision: str = "3") -> Obj:
    return {
        "metadata": {
            "name": "web-5d8f6c",
            "labels": {"app": "web", "pod-template-hash": "5d8f6c"},
            "annotations": {REVISION_ANNOTATION: revision},
            "ownerReferences": [{"uid": "web-uid", "controller": True}],
        },
        "spec": {
            "template": {
                "metadata": {"labels": {"app": "web", "pod-template-hash": "5d8f6c"}},
                "spec": {"containers": [{"name": "app", "image": "app:v1"}]},
            }
        },
    }


def test_what_follow_mode_reads_of_a_held_deployment() -> None:
    d = held_deployment()
    rs = replicaset_of(stable_replicaset())
    w = workload_of(d, None, follow=True, stable=rs)
    assert (w.paused, w.is_held, w.enrolled, w.replicas, w.updated, w.total) == (True, True, "web", 6, 0, 6)
    assert w.digest == w.held == template_digest(d["spec"]["template"])
    assert w.images == (("app", "app:v2"), ("proxy", "proxy:1"))
    assert w.stable == rs and (rs.name, rs.template_hash, rs.revision) == ("web-5d8f6c", "5d8f6c", "3")
    assert rs.images == (("app", "app:v1"),)
    # Without follow, none of it is computed (pinned mode reads what it always did).
    pinned = workload_of(d, "app")
    assert (pinned.digest, pinned.held, pinned.paused, pinned.stable) == ("", "", False, None)


def test_the_deployment_controllers_timeout_of_a_rollout_is_read_from_its_progressing_condition() -> None:
    d = held_deployment()
    d["spec"].update(paused=False, progressDeadlineSeconds=600)
    progressing = {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated", "message": "going"}
    d["status"]["conditions"] = [{"type": "Available", "status": "True"}, progressing]
    w = workload_of(d, None, follow=True)
    assert (w.progress_deadline, w.timed_out, w.reports_timeouts()) == (600, "", True)
    progressing.update(status="False", reason="ProgressDeadlineExceeded", message='ReplicaSet "web-7c9f" has timed out')
    w = workload_of(d, None, follow=True)
    assert w.timed_out == 'ReplicaSet "web-7c9f" has timed out'
    assert w.rollout_timed_out(w.digest) == w.timed_out and w.rollout_timed_out("another") == ""
    d["metadata"]["generation"] = 5  # not yet observed (observedGeneration 4): about the rollout before
    assert workload_of(d, None, follow=True).rollout_timed_out(w.digest) == ""
    d["spec"]["progressDeadlineSeconds"] = 2**31 - 1  # the largest: the controller reports no timeout
    assert not workload_of(d, None, follow=True).reports_timeouts()
    del d["spec"]["progressDeadlineSeconds"]
    assert not workload_of(d, None, follow=True).reports_timeouts()


def test_a_replicaset_has_the_digest_of_the_template_it_was_made_from() -> None:
    """The pod-template-hash label the Deployment controller adds is not counted: a revert is seen."""
    rs = stable_replicaset()
    template = copy.deepcopy(rs["spec"]["template"])
    del template["metadata"]["labels"]["pod-template-hash"]
    assert replicaset_of(rs).digest == template_digest(template)


def test_the_current_replicaset_is_the_one_of_the_deployments_revision() -> None:
    d = held_deployment()
    old, current, foreign = stable_replicaset("2"), stable_replicaset("3"), stable_replicaset("3")
    old["metadata"]["name"] = "web-old"
    foreign["metadata"]["ownerReferences"] = [{"uid": "other", "controller": True}]
    assert current_replicaset(d, [foreign, old, current]) is current
    assert current_replicaset(d, [old]) is None


def test_the_canary_is_the_held_template_as_written_without_gitops_tracking() -> None:
    d = held_deployment()
    digest = template_digest(d["spec"]["template"])
    canary = build_template_canary(d, RELEASE, digest=digest, replicas=2)
    template = canary["spec"]["template"]
    assert template["spec"] == d["spec"]["template"]["spec"]  # every container, env, config reference
    assert template["metadata"]["labels"] == {
        "app": "web",
        "app.kubernetes.io/instance": "shop-web",  # pod labels stay: selectors may use them
        TRACK_LABEL: "canary",
        VERSION_LABEL: digest,
    }
    meta = canary["metadata"]
    assert meta["labels"] == {"app": "web", RELEASE_LABEL: "web", TRACK_LABEL: "canary"}
    assert set(meta["annotations"]) == {"greyrelease.io/template-hash", SOURCE_ANNOTATION}
    assert meta["annotations"][SOURCE_ANNOTATION] == digest
    assert "paused" not in canary["spec"] and canary["spec"]["replicas"] == 2
    assert canary["spec"]["strategy"] == {"rollingUpdate": {"maxSurge": 1}}
    assert canary["spec"]["selector"]["matchLabels"] == {"app": "web", TRACK_LABEL: "canary"}


def test_a_canary_of_another_template_is_patched_with_its_source() -> None:
    d = held_deployment()
    first = build_template_canary(d, RELEASE, digest="a" * 16, replicas=2)
    d["spec"]["template"]["spec"]["containers"][0]["image"] = "app:v3"
    desired = build_template_canary(d, RELEASE, digest="b" * 16, replicas=2)
    patch = canary_patch(first, desired)
    assert patch is not None and patch["metadata"]["annotations"][SOURCE_ANNOTATION] == "b" * 16
    assert patch["spec"]["template"]["spec"]["containers"][0]["image"] == "app:v3"
    assert canary_patch(desired, desired) is None


def test_enrolment_and_the_hold_are_seen_and_written_only_when_they_differ() -> None:
    d = held_deployment()
    assert enrol_patch(d, "web") is None
    assert unenrol_patch(d, "other") is None  # another release's label is left
    assert unenrol_patch(d, "web") == {"metadata": {"labels": {RELEASE_LABEL: None}}}
    del d["metadata"]["labels"][RELEASE_LABEL]
    assert enrol_patch(d, "web") == {"metadata": {"labels": {RELEASE_LABEL: "web"}}}
    digest = d["metadata"]["annotations"][HELD_ANNOTATION]
    assert holds(d, digest) and not holds(d, "other")
    d["spec"]["paused"] = False
    assert not holds(d, digest)
