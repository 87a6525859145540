"""The nginx and Gateway API routers: pure builders table-tested, then the routers driven through whole
releases by the planner against an in-memory object store (no cluster)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from greyrelease.api.release import ABORT_ANNOTATION, GreyReleaseSpec, GreyReleaseStatus
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.memory import merge_patch as merge
from greyrelease.kube.protocol import Conflict, Ref, path
from greyrelease.kube.workload import owner_reference
from greyrelease.planner.actions import PrepareRouting, ResetRouting, RestoreStableSelector, SetWeight
from greyrelease.planner.machine import decide
from greyrelease.reconcile.observe import observe
from greyrelease.routers import Router, router_for
from greyrelease.routers.canary_service import build_canary_service, service_patch
from greyrelease.routers.gateway import (
    ORIGINAL_RULES_ANNOTATION,
    normal_rules,
    restore_patch,
    route_problem,
    weight_patch,
    weighted_rules,
)
from greyrelease.routers.nginx import build_canary_ingress, canary_annotations, canary_rules, ingress_patch
from greyrelease.routers.selector import ORIGINAL_SELECTOR_ANNOTATION

from tests.support.builders import UID
from tests.support.faults import Crash, crash_before_write
from tests.support.world import World, spec

Obj = dict[str, Any]
NS = "shop"
P = "nginx.ingress.kubernetes.io"
RELEASE: Obj = {"metadata": {"name": "web", "namespace": NS, "uid": UID}}
OWNER = owner_reference(RELEASE)
NGINX = {"nginx": {"ingress": "web", "stableService": "web"}}
GATEWAY = {"gatewayAPI": {"httpRoute": "web", "stableService": "web"}}


# --- objects a user would have --------------------------------------------------------------------


def backend(service: str, port: int | str = 80) -> Obj:
    return {"service": {"name": service, "port": {"number": port} if isinstance(port, int) else {"name": port}}}


def http_path(service: str, p: str = "/", port: int | str = 80) -> Obj:
    return {"path": p, "pathType": "Prefix", "backend": backend(service, port)}


def ingress(*rules: Obj, **spec: Any) -> Obj:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"ingressClassName": "nginx", "rules": list(rules), **spec},
    }


def service(name: str = "web", selector: Obj | None = None, **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "selector": selector or {"app": "web"},
            "clusterIP": "10.0.0.7",
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
            **spec,
        },
    }


def ref(name: str, weight: int | None = None, port: int = 80) -> Obj:
    out: Obj = {"name": name, "port": port}
    if weight is not None:
        out["weight"] = weight
    return out


def route(*rules: Obj) -> Obj:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "web", "namespace": NS, "resourceVersion": "1"},
        "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["web.example"], "rules": list(rules)},
    }


# --- the in-memory API server, and what the tests read of it --------------------------------------


WRITE_NAMES = {"POST": "create", "PATCH": "patch", "PUT": "replace", "DELETE": "delete"}


def writes(kube: MemoryKube) -> list[tuple[str, Ref]]:
    """The writes since the requests were last cleared, as ("create" | "patch" | "delete", path)."""
    return [(WRITE_NAMES[verb], p) for verb, p in kube.writes]


def by_path(kube: MemoryKube) -> dict[Ref, Obj]:
    return {MemoryKube.path_of(o): o for o in kube.objects()}


#: What the API server sets on every object and bumps on writes.
SERVER_FIELDS = ("resourceVersion", "generation", "uid", "creationTimestamp")


def without_server_fields(obj: Obj) -> Obj:
    obj = copy.deepcopy(obj)
    for key in SERVER_FIELDS:
        obj["metadata"].pop(key, None)
    return obj


ING = path("networking.k8s.io", "v1", "ingresses", NS, "web")
CANARY_ING = path("networking.k8s.io", "v1", "ingresses", NS, "web-canary")
SVC = path("", "v1", "services", NS, "web")
CANARY_SVC = path("", "v1", "services", NS, "web-canary")
ROUTE = path("gateway.networking.k8s.io", "v1", "httproutes", NS, "web")


def user_objects(kube: MemoryKube) -> dict[Ref, Obj]:
    """The user's objects without the fields the API server sets and bumps on writes."""
    out = {}
    for p in (ING, SVC, ROUTE):
        obj = kube.get(p)
        if obj is not None:
            out[p] = without_server_fields(obj)
    return out


#: The stable ReplicaSet's pod-template-hash, as the planner puts it into the routing actions.
STABLE_HASH = "stablehash"


def make_router(kube: MemoryKube, routing: Obj, **fields: Any) -> Router:
    s = spec(trafficRouting=routing, **fields)
    return router_for(kube, namespace=NS, release=RELEASE, spec=s, canary="web-canary")


# --- nginx: pure builders --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rules, expected",
    [
        pytest.param(
            [{"host": "a.example", "http": {"paths": [http_path("web")]}}],
            [{"host": "a.example", "http": {"paths": [http_path("web-canary")]}}],
            id="one-path",
        ),
        pytest.param(
            [{"host": "a.example", "http": {"paths": [http_path("web", "/"), http_path("static", "/s")]}}],
            [{"host": "a.example", "http": {"paths": [http_path("web-canary", "/")]}}],
            id="only-the-stable-paths",
        ),
        pytest.param(
            [
                {"host": "a.example", "http": {"paths": [http_path("web", port="http")]}},
                {"host": "b.example", "http": {"paths": [http_path("other")]}},
                {"http": {"paths": [http_path("web", "/api")]}},
            ],
            [
                {"host": "a.example", "http": {"paths": [http_path("web-canary", port="http")]}},
                {"http": {"paths": [http_path("web-canary", "/api")]}},
            ],
            id="hosts-kept-named-port-kept-other-hosts-dropped",
        ),
        pytest.param([{"host": "a.example", "http": {"paths": [http_path("other")]}}], [], id="no-stable-path"),
    ],
)
def test_canary_rules_copy_only_the_paths_to_the_stable_service(rules: list[Obj], expected: list[Obj]) -> None:
    user = ingress(*rules)
    before = copy.deepcopy(user)
    assert canary_rules(user, stable_service="web", canary_service="web-canary") == expected
    assert user == before


@pytest.mark.parametrize(
    "weight, headers, expected",
    [
        pytest.param(
            0,
            None,
            {"canary": "true", "canary-weight": "0", "canary-by-header": None, "canary-by-header-value": None},
            id="prepared",
        ),
        pytest.param(
            30,
            None,
            {"canary": "true", "canary-weight": "30", "canary-by-header": None, "canary-by-header-value": None},
            id="weight",
        ),
        pytest.param(
            30,
            {"X-Canary": "yes"},
            {"canary": "true", "canary-weight": "30", "canary-by-header": "X-Canary", "canary-by-header-value": "yes"},
            id="weight-and-header",
        ),
        pytest.param(
            0,
            {"X-Canary": "yes"},
            {"canary": "true", "canary-weight": "0", "canary-by-header": None, "canary-by-header-value": None},
            id="abort-drops-header",
        ),
    ],
)
def test_canary_annotations(weight: int, headers: dict[str, str] | None, expected: Obj) -> None:
    assert canary_annotations(P, weight, headers) == {f"{P}/{k}": v for k, v in expected.items()}


def test_canary_ingress_keeps_class_hosts_and_tls_and_is_owned() -> None:
    tls = [{"hosts": ["a.example"], "secretName": "a-tls"}]
    user = ingress({"host": "a.example", "http": {"paths": [http_path("web")]}}, tls=tls)
    user["metadata"]["annotations"] = {"kubernetes.io/ingress.class": "nginx-internal", f"{P}/rewrite-target": "/"}
    canary = build_canary_ingress(user, stable_service="web", prefix=P, weight=0, header_match=None, owner=OWNER)
    assert canary["metadata"]["name"] == "web-canary"
    assert canary["metadata"]["ownerReferences"] == [OWNER]
    assert canary["metadata"]["labels"] == {"greyrelease.io/release": "web"}
    assert canary["metadata"]["annotations"] == {
        f"{P}/canary": "true",
        f"{P}/canary-weight": "0",
        "kubernetes.io/ingress.class": "nginx-internal",
    }
    assert canary["spec"] == {
        "ingressClassName": "nginx",
        "tls": tls,
        "rules": [{"host": "a.example", "http": {"paths": [http_path("web-canary")]}}],
    }


def test_ingress_patch_is_none_when_equal_and_only_what_changed_otherwise() -> None:
    user = ingress({"host": "a.example", "http": {"paths": [http_path("web")]}})
    at0 = build_canary_ingress(user, stable_service="web", prefix=P, weight=0, header_match=None, owner=OWNER)
    at20h = build_canary_ingress(user, stable_service="web", prefix=P, weight=20, header_match={"x": "1"}, owner=OWNER)
    assert ingress_patch(at0, at0, P) is None
    assert ingress_patch(at0, at20h, P) == {
        "metadata": {
            "annotations": {
                f"{P}/canary-weight": "20",
                f"{P}/canary-by-header": "x",
                f"{P}/canary-by-header-value": "1",
            }
        }
    }
    assert ingress_patch(at20h, at0, P) == {
        "metadata": {
            "annotations": {
                f"{P}/canary-weight": "0",
                f"{P}/canary-by-header": None,
                f"{P}/canary-by-header-value": None,
            }
        }
    }
    moved = ingress({"host": "b.example", "http": {"paths": [http_path("web")]}})
    desired = build_canary_ingress(moved, stable_service="web", prefix=P, weight=0, header_match=None, owner=OWNER)
    assert ingress_patch(at0, desired, P) == {"spec": {"rules": desired["spec"]["rules"]}}


@pytest.mark.parametrize(
    "stable, selector",
    [
        pytest.param(service(), {"app": "web", "greyrelease.io/track": "canary"}, id="plain"),
        pytest.param(
            merge(
                service(selector={"app": "web", "pod-template-hash": "h1"}),
                {"metadata": {"annotations": {ORIGINAL_SELECTOR_ANNOTATION: json.dumps({"app": "web"})}}},
            ),
            {"app": "web", "greyrelease.io/track": "canary"},
            id="narrowed-stable-uses-the-users-selector",
        ),
    ],
)
def test_canary_service_copies_ports_not_address(stable: Obj, selector: Obj) -> None:
    stable = merge(
        stable,
        {
            "spec": {
                "type": "NodePort",
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}],
            }
        },
    )
    canary = build_canary_service(stable, owner=OWNER)
    assert canary["metadata"]["name"] == "web-canary" and canary["metadata"]["ownerReferences"] == [OWNER]
    assert canary["spec"] == {
        "selector": selector,
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
    }
    stored = merge(canary, {"spec": {"clusterIP": "10.0.0.9", "type": "ClusterIP"}})
    assert service_patch(stored, canary) is None


# --- Gateway API: pure builders --------------------------------------------------------------------


HDR = {"x-canary": "yes"}


@pytest.mark.parametrize(
    "rules, weight, headers, expected",
    [
        pytest.param(
            [{"backendRefs": [ref("web")]}],
            0,
            None,
            [{"backendRefs": [ref("web", 100), ref("web-canary", 0)]}],
            id="prepared",
        ),
        pytest.param(
            [{"backendRefs": [ref("web")]}],
            30,
            None,
            [{"backendRefs": [ref("web", 70), ref("web-canary", 30)]}],
            id="alone-in-its-rule",
        ),
        pytest.param(
            [{"backendRefs": [ref("web", 3), ref("legacy", 1)]}],
            20,
            None,
            [{"backendRefs": [ref("web", 240), ref("web-canary", 60), ref("legacy", 100)]}],
            id="beside-another-backend-its-share-is-kept",
        ),
        pytest.param(
            [
                {"matches": [{"path": {"type": "PathPrefix", "value": "/s"}}], "backendRefs": [ref("static")]},
                {"backendRefs": [ref("web")]},
            ],
            100,
            None,
            [
                {"matches": [{"path": {"type": "PathPrefix", "value": "/s"}}], "backendRefs": [ref("static")]},
                {"backendRefs": [ref("web", 0), ref("web-canary", 100)]},
            ],
            id="other-rules-untouched",
        ),
        pytest.param(
            [
                {
                    "name": "api",
                    "matches": [
                        {
                            "path": {"type": "PathPrefix", "value": "/api"},
                            "headers": [{"name": "X-Canary", "value": "no"}],
                        }
                    ],
                    "backendRefs": [ref("web", 5)],
                }
            ],
            10,
            HDR,
            [
                {
                    "matches": [
                        {
                            "path": {"type": "PathPrefix", "value": "/api"},
                            "headers": [{"type": "Exact", "name": "x-canary", "value": "yes"}],
                        }
                    ],
                    "backendRefs": [ref("web-canary")],
                },
                {
                    "name": "api",
                    "matches": [
                        {
                            "path": {"type": "PathPrefix", "value": "/api"},
                            "headers": [{"name": "X-Canary", "value": "no"}],
                        }
                    ],
                    "backendRefs": [ref("web", 90), ref("web-canary", 10)],
                },
            ],
            id="header-rule-first-with-the-users-path",
        ),
        pytest.param(
            [{"backendRefs": [ref("web")]}],
            0,
            HDR,
            [{"backendRefs": [ref("web", 100), ref("web-canary", 0)]}],
            id="weight-0-drops-the-header-rule",
        ),
    ],
)
def test_weighted_rules(rules: list[Obj], weight: int, headers: Obj | None, expected: list[Obj]) -> None:
    before = copy.deepcopy(rules)
    assert weighted_rules(rules, service="web", namespace=NS, weight=weight, header_match=headers) == expected
    assert rules == before


def test_weight_patch_saves_the_users_rules_once_and_restore_is_exact() -> None:
    user = route({"matches": [{"path": {"type": "Exact", "value": "/"}}], "backendRefs": [ref("web")]})
    first = weight_patch(user, service="web", weight=0)
    assert first is not None
    assert first["metadata"]["resourceVersion"] == "1"
    assert json.loads(first["metadata"]["annotations"][ORIGINAL_RULES_ANNOTATION]) == user["spec"]["rules"]
    prepared = merge(user, first)
    assert weight_patch(prepared, service="web", weight=0) is None  # idempotent
    at40 = merge(prepared, weight_patch(prepared, service="web", weight=40, header_match=HDR))
    assert "annotations" not in (weight_patch(prepared, service="web", weight=40) or {})["metadata"]
    assert len(at40["spec"]["rules"]) == 2
    restored = merge(at40, restore_patch(at40))
    assert restored["spec"] == user["spec"]
    assert ORIGINAL_RULES_ANNOTATION not in (restored["metadata"].get("annotations") or {})
    assert restore_patch(user) is None


def test_a_route_stored_with_the_upstream_defaults_compares_equal() -> None:
    """The upstream CRD fills in match paths, header types, ref group/kind/weight: not a change."""
    built = weighted_rules([{"backendRefs": [ref("web")]}], service="web", namespace=NS, weight=10, header_match=HDR)
    stored = normal_rules(built)
    assert stored != built and normal_rules(stored) == normal_rules(built)


@pytest.mark.parametrize(
    "obj, message",
    [
        pytest.param(None, "HTTPRoute 'web' not found", id="missing"),
        pytest.param(route({"backendRefs": [ref("other")]}), "has no backendRef to Service 'web'", id="no-stable-rule"),
        pytest.param(
            route({"backendRefs": [ref("web"), ref("web-canary")]}),
            "already routes to Service 'web-canary'",
            id="users-own-canary",
        ),
        pytest.param(route({"backendRefs": [ref("web")]}), "", id="fine"),
    ],
)
def test_route_problem(obj: Obj | None, message: str) -> None:
    found = route_problem(obj, name="web", service="web")
    assert (message in found) if message else found == ""


# --- routers against the store: refusal, idempotence, exact restore --------------------------------


# The stable Deployment and its ReplicaSet: where a first pass reads the hash the stable Service is narrowed to.
STABLE: list[Obj] = [
    {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "namespace": NS,
            "uid": "web-uid",
            "annotations": {"deployment.kubernetes.io/revision": "1"},
        },
        "spec": {"selector": {"matchLabels": {"app": "web"}}},
    },
    {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": "web-stablehash",
            "namespace": NS,
            "labels": {"app": "web", "pod-template-hash": "stablehash"},
            "annotations": {"deployment.kubernetes.io/revision": "1"},
            "ownerReferences": [{"uid": "web-uid", "controller": True}],
        },
    },
]


def nginx_world(*extra: Obj) -> MemoryKube:
    return MemoryKube(
        ingress({"host": "a.example", "http": {"paths": [http_path("web"), http_path("static", "/s")]}}),
        service(),
        *STABLE,
        *extra,
    )


def gateway_world(*extra: Obj) -> MemoryKube:
    return MemoryKube(route({"backendRefs": [ref("web")]}), service(), *STABLE, *extra)


FOREIGN_INGRESS = merge(ingress(), {"metadata": {"name": "web-canary", "ownerReferences": [{"uid": "someone-else"}]}})
FOREIGN_SERVICE = service("web-canary")


@pytest.mark.parametrize(
    "world, routing, fields, message",
    [
        pytest.param(
            lambda: nginx_world(FOREIGN_INGRESS),
            NGINX,
            {},
            "Ingress 'web-canary' exists and is not owned by this release",
            id="nginx-foreign-ingress",
        ),
        pytest.param(
            lambda: nginx_world(FOREIGN_SERVICE),
            NGINX,
            {},
            "Service 'web-canary' exists and is not owned by this release",
            id="nginx-foreign-service",
        ),
        pytest.param(
            lambda: gateway_world(FOREIGN_SERVICE),
            GATEWAY,
            {},
            "Service 'web-canary' exists and is not owned by this release",
            id="gateway-foreign-service",
        ),
        pytest.param(lambda: MemoryKube(service()), NGINX, {}, "Ingress 'web' not found", id="nginx-no-ingress"),
        pytest.param(
            lambda: MemoryKube(ingress({"http": {"paths": [http_path("web")]}})),
            NGINX,
            {},
            "Service 'web' not found",
            id="nginx-no-service",
        ),
        pytest.param(
            lambda: MemoryKube(ingress({"http": {"paths": [http_path("x")]}}), service()),
            NGINX,
            {},
            "has no path to Service 'web'",
            id="nginx-no-stable-path",
        ),
        pytest.param(
            nginx_world,
            NGINX,
            {
                "batches": [{"replicas": 1, "headerMatch": {"a": "1", "b": "2"}}, {"replicas": 2}],
                "batchSize": None,
                "canaryWeight": None,
            },
            "spec.batches[0].headerMatch",
            id="nginx-two-headers",
        ),
        pytest.param(lambda: MemoryKube(service()), GATEWAY, {}, "HTTPRoute 'web' not found", id="gateway-no-route"),
    ],
)
def test_problem_is_read_only_and_marks_the_release_invalid_before_anything_is_touched(
    world: Any, routing: Obj, fields: Obj, message: str
) -> None:
    kube = world()
    before = by_path(kube)
    router = make_router(kube, routing, **fields)
    problem = router.problem()
    assert message in problem and problem.startswith("spec.")
    assert writes(kube) == [] and by_path(kube) == before
    w = World(spec(trafficRouting=routing, **fields))
    plan = decide(w.spec, w.status, replace(w.observed(), routing_error=problem), w.now)
    assert plan.status.phase == "InvalidSpec" and plan.actions == () and message in plan.status.message


@pytest.mark.parametrize(
    "routing, foreign",
    [
        pytest.param(NGINX, FOREIGN_INGRESS, id="ingress"),
        pytest.param(NGINX, FOREIGN_SERVICE, id="service-nginx"),
        pytest.param(GATEWAY, FOREIGN_SERVICE, id="service-gateway"),
    ],
)
def test_foreign_objects_are_refused_by_writes_and_left_alone_by_abort_and_reset(routing: Obj, foreign: Obj) -> None:
    kube = (nginx_world if "nginx" in routing else gateway_world)(foreign)
    before = kube.get(MemoryKube.path_of(foreign))
    router = make_router(kube, routing)
    with pytest.raises(RuntimeError, match="not owned by this release"):
        router.prepare(STABLE_HASH)
    with pytest.raises(RuntimeError, match="not owned by this release"):
        router.set_weight(20)
    router.set_weight(0)
    router.reset()
    assert kube.get(MemoryKube.path_of(foreign)) == before


def test_nginx_router_prepares_weighs_and_resets_idempotently() -> None:
    kube = nginx_world()
    original = user_objects(kube)
    router = make_router(kube, NGINX)
    router.prepare(STABLE_HASH)
    canary = kube.get(CANARY_ING)
    assert canary is not None and canary["metadata"]["annotations"][f"{P}/canary-weight"] == "0"
    assert canary["spec"]["rules"] == [{"host": "a.example", "http": {"paths": [http_path("web-canary")]}}]
    canary_svc = kube.get(CANARY_SVC)
    assert canary_svc is not None and canary_svc["spec"]["selector"] == {"app": "web", "greyrelease.io/track": "canary"}
    assert "clusterIP" not in canary_svc["spec"]
    assert (kube.get(SVC) or {})["spec"]["selector"] == {"app": "web", "pod-template-hash": "stablehash"}
    kube.requests.clear()
    router.prepare(STABLE_HASH)  # a controller killed after preparing prepares again: nothing to write
    router.set_weight(0)
    assert writes(kube) == []

    router.set_weight(20, {"x-canary": "yes"})
    router.set_weight(20, {"x-canary": "yes"})
    assert writes(kube) == [("patch", CANARY_ING)]
    annotations = (kube.get(CANARY_ING) or {})["metadata"]["annotations"]
    assert annotations[f"{P}/canary-weight"] == "20" and annotations[f"{P}/canary-by-header"] == "x-canary"
    router.set_weight(0)
    annotations = (kube.get(CANARY_ING) or {})["metadata"]["annotations"]
    assert annotations[f"{P}/canary-weight"] == "0" and f"{P}/canary-by-header" not in annotations

    router.reset()
    router.reset()
    assert kube.get(CANARY_ING) is None and kube.get(CANARY_SVC) is None
    assert user_objects(kube) == original


def test_gateway_router_prepares_weighs_and_restores_the_route_exactly() -> None:
    kube = gateway_world()
    original = user_objects(kube)
    router = make_router(kube, GATEWAY)
    router.prepare(STABLE_HASH)
    rules = (kube.get(ROUTE) or {})["spec"]["rules"]
    assert rules == [{"backendRefs": [ref("web", 100), ref("web-canary", 0)]}]
    assert kube.get(CANARY_SVC) is not None
    kube.requests.clear()
    router.prepare(STABLE_HASH)
    router.set_weight(0)
    assert writes(kube) == []
    router.set_weight(50, HDR)
    rules = (kube.get(ROUTE) or {})["spec"]["rules"]
    assert [r["backendRefs"] for r in rules] == [[ref("web-canary")], [ref("web", 50), ref("web-canary", 50)]]
    router.set_weight(0)
    assert (kube.get(ROUTE) or {})["spec"]["rules"] == [{"backendRefs": [ref("web", 100), ref("web-canary", 0)]}]
    router.reset()
    router.reset()
    assert kube.get(CANARY_SVC) is None
    assert user_objects(kube) == original


def endpoint_slice(name: str, service: str, *endpoints: Obj) -> Obj:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": service}},
        "endpoints": list(endpoints),
    }


def pod_endpoint(pod: str, address: str, ready: bool | None) -> Obj:
    conditions = {} if ready is None else {"ready": ready}
    return {"addresses": [address], "conditions": conditions, "targetRef": {"kind": "Pod", "name": pod, "uid": pod}}


@pytest.mark.parametrize("routing", [pytest.param(NGINX, id="nginx"), pytest.param(GATEWAY, id="gateway")])
def test_canary_endpoints_count_each_ready_canary_pod_once(routing: Obj) -> None:
    slices = [
        # Dual stack: one slice per address family, each listing the same two pods.
        endpoint_slice(
            "web-canary-v4",
            "web-canary",
            pod_endpoint("c1", "10.0.0.1", True),
            pod_endpoint("c2", "10.0.0.2", None),
            pod_endpoint("c3", "10.0.0.3", False),
        ),
        endpoint_slice(
            "web-canary-v6", "web-canary", pod_endpoint("c1", "fd00::1", True), pod_endpoint("c2", "fd00::2", True)
        ),
        endpoint_slice("web-stable", "web", pod_endpoint("s1", "10.0.1.1", True)),  # another Service's
    ]
    kube = (nginx_world if "nginx" in routing else gateway_world)(*slices)
    router = make_router(kube, routing)
    assert router.canary_endpoints() == 2
    assert writes(kube) == []
    kube.delete(path("discovery.k8s.io", "v1", "endpointslices", NS, "web-canary-v4"))
    kube.delete(path("discovery.k8s.io", "v1", "endpointslices", NS, "web-canary-v6"))
    assert router.canary_endpoints() == 0


def canary_deployment(ready: int) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web-canary",
            "namespace": NS,
            "uid": "canary-uid",
            "ownerReferences": [{"uid": UID, "controller": True}],
        },
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"spec": {"containers": [{"name": "app", "image": "app:v2"}]}},
        },
        "status": {"replicas": 2, "readyReplicas": ready},
    }


@pytest.mark.parametrize(
    ("phase", "state", "ready", "read"),
    [
        ("Progressing", "Upscaling", 1, True),
        ("Paused", "Upscaling", 2, True),  # resumed, it may go live in the same pass
        ("Progressing", "Upscaling", 0, False),  # no canary pod ready: nothing to route to yet
        ("Progressing", "Verifying", 2, False),  # live already
        ("Promoting", None, 2, False),
    ],
)
def test_the_canary_endpoints_are_read_only_while_a_batch_may_go_live(
    phase: str, state: str | None, ready: int, read: bool
) -> None:
    kube = gateway_world(
        canary_deployment(ready), endpoint_slice("web-canary-a", "web-canary", pod_endpoint("c1", "10.0.0.1", True))
    )
    template = {"spec": {"containers": [{"name": "app", "image": "app:v1"}]}}
    kube.put({**STABLE[0], "spec": {**STABLE[0]["spec"], "replicas": 4, "template": template}})
    status = GreyReleaseStatus.model_validate(
        {"phase": phase, "batchState": state, "currentBatch": 1, "targetName": "web"}
    )
    s = spec(trafficRouting=GATEWAY, targetRef={"name": "web"})
    seen = observe(kube, RELEASE, s, status).observed
    assert seen.canary is not None and seen.canary.ready == ready
    assert seen.canary_endpoints == (1 if read else None)


@pytest.mark.parametrize("routing", [{"service": {"name": "web"}}, None])
def test_modes_without_a_canary_service_read_no_endpoints(routing: Obj) -> None:
    kube = MemoryKube(service())
    router = make_router(kube, routing)
    kube.requests.clear()
    assert router.canary_endpoints() is None
    assert kube.requests == []


def test_gateway_write_on_a_route_edited_since_it_was_read_is_a_conflict() -> None:
    kube = gateway_world()
    router = make_router(kube, GATEWAY)
    router.prepare(STABLE_HASH)
    stale = kube.get(ROUTE) or {}
    kube.patch(ROUTE, {"spec": {"hostnames": ["edited.example"]}})  # the user, in between
    with pytest.raises(Conflict):
        kube.patch(ROUTE, weight_patch(stale, service="web", weight=30) or {})
    router.set_weight(30)  # the next pass reads again and succeeds
    assert (kube.get(ROUTE) or {})["spec"]["hostnames"] == ["edited.example"]


def test_gateway_abort_before_prepare_writes_nothing() -> None:
    kube = gateway_world()
    make_router(kube, GATEWAY).set_weight(0)
    make_router(kube, GATEWAY).reset()
    assert writes(kube) == []


# --- whole releases: the planner's actions applied to the real routers -----------------------------


class RoutedWorld(World):
    """The planner's world, with its routing actions also applied to a router on the store (a router
    is built for each action, as the reconciler builds one for each pass; what it acts on comes with the
    action)."""

    kube: MemoryKube
    routing_log: list[Any]

    def apply(self, action: object) -> None:
        super().apply(action)
        router = router_for(self.kube, namespace=NS, release=RELEASE, spec=self.spec, canary="web-canary")
        match action:
            case PrepareRouting(stable_hash=stable_hash):
                router.prepare(stable_hash)
            case SetWeight(weight=w, header_match=h, stable_hash=stable_hash):
                router.set_weight(w, h, stable_hash=stable_hash)
            case RestoreStableSelector():
                router.restore_stable_selector()
            case ResetRouting():
                router.reset()
            case _:
                return
        self.routing_log.append((action, self.readback()))

    def readback(self) -> Obj:
        """Weight seen on the routing objects, and whether the stable Service is narrowed."""
        narrowed = "pod-template-hash" in ((self.kube.get(SVC) or {}).get("spec", {}).get("selector") or {})
        canary = self.kube.get(CANARY_ING)
        if canary is not None:
            return {"weight": int(canary["metadata"]["annotations"][f"{P}/canary-weight"]), "narrowed": narrowed}
        rules = (self.kube.get(ROUTE) or {}).get("spec", {}).get("rules") or []
        weights = [
            r.get("weight") for rule in rules for r in rule.get("backendRefs") or [] if r["name"] == "web-canary"
        ]
        return {"weight": weights[0] if weights else None, "narrowed": narrowed}


def routed(routing: Obj, **fields: Any) -> RoutedWorld:
    w = RoutedWorld(spec(trafficRouting=routing, **fields))
    w.kube = nginx_world() if "nginx" in routing else gateway_world()
    w.routing_log = []
    return w


BATCHES: Obj = {
    "batches": [
        {"replicas": 1, "weight": 20},
        {"replicas": 2, "weight": 50},
        {"replicas": 3, "weight": 80},
        {"replicas": 4},
    ],
    "batchSize": None,
    "canaryWeight": None,
}


@pytest.mark.parametrize("routing", [pytest.param(NGINX, id="nginx"), pytest.param(GATEWAY, id="gateway")])
def test_full_release_moves_the_weights_and_leaves_the_users_objects_as_written(routing: Obj) -> None:
    w = routed(routing, **BATCHES)
    original = user_objects(w.kube)
    w.run(until={"Succeeded"})
    log = w.routing_log
    assert log[0] == (PrepareRouting(), {"weight": 0, "narrowed": True})
    # Prepared before the first canary pod: the planner's first plan prepares and creates nothing else.
    assert [a for a, _ in log if isinstance(a, SetWeight)] == [
        SetWeight(20),
        SetWeight(50),
        SetWeight(80),
        SetWeight(100),
        SetWeight(0),
    ]
    assert [seen["weight"] for a, seen in log if isinstance(a, SetWeight)] == [20, 50, 80, 100, 0]
    # The narrowing goes before the stable rolls, and only then does the weight go back to stable.
    kinds = [type(a) for a, _ in log]
    assert kinds.index(RestoreStableSelector) < len(kinds) - 2
    assert log[kinds.index(RestoreStableSelector)][1] == {"weight": 100, "narrowed": False}
    assert kinds[-1] is ResetRouting
    assert w.kube.get(CANARY_ING) is None and w.kube.get(CANARY_SVC) is None
    assert user_objects(w.kube) == original


@pytest.mark.parametrize("routing", [pytest.param(NGINX, id="nginx"), pytest.param(GATEWAY, id="gateway")])
@pytest.mark.parametrize("how", ["abort", "delete"])
def test_abort_and_deletion_send_the_weight_to_zero_first_and_clean_up(routing: Obj, how: str) -> None:
    held = [{**b, "pause": "1h"} if b["replicas"] == 2 else b for b in BATCHES["batches"]]  # batch 2 stays live
    w = routed(routing, **{**BATCHES, "batches": held})
    original = user_objects(w.kube)
    for _ in range(50):
        w.step()
        if w.status.current_batch == 2 and w.status.batch_times.ready_at:
            break
        w.advance(1)
    assert w.routing_log[-1][1]["weight"] == 50
    if how == "abort":
        w.annotations[ABORT_ANNOTATION] = "true"
    else:
        w.deleting = True
    plan = w.step()
    assert plan.actions[0] == SetWeight(0)
    assert w.routing_log[-1] == (SetWeight(0), {"weight": 0, "narrowed": True})
    for _ in range(20):
        if w.status.phase == "Aborted" or (how == "delete" and w.plans[-1].done):
            break
        w.advance(10)
        w.step()
    assert isinstance(w.routing_log[-1][0], ResetRouting)
    assert w.kube.get(CANARY_ING) is None and w.kube.get(CANARY_SVC) is None
    assert user_objects(w.kube) == original


def test_spec_model_accepts_both_modes() -> None:
    for routing in (NGINX, GATEWAY):
        assert GreyReleaseSpec.model_validate(
            {
                "targetRef": {"name": "web"},
                "targetVersion": "v2",
                "batchSize": 1,
                "canaryWeight": 50,
                "trafficRouting": routing,
            }
        )


STEPS: list[Callable[[Router], None]] = [
    lambda r: r.prepare(STABLE_HASH),
    lambda r: r.set_weight(20, {"x-canary": "yes"}),
    lambda r: r.set_weight(60),
    lambda r: r.set_weight(0),
    lambda r: r.restore_stable_selector(),
    lambda r: r.reset(),
]


def _states(kube: MemoryKube, routing: Obj) -> list[dict[Ref, Obj]]:
    """The objects after each step; a step that crashes is run again, as the next pass would."""
    out = []
    for run in STEPS:
        try:
            run(make_router(kube, routing))
        except Crash:
            run(make_router(kube, routing))
        out.append(_snapshot(kube))
    return out


def _snapshot(kube: MemoryKube) -> dict[Ref, Obj]:
    """Every object, without the fields the API server sets (those of a created object differ by run)."""
    return {p: without_server_fields(obj) for p, obj in by_path(kube).items()}


@pytest.mark.parametrize("routing", [pytest.param(NGINX, id="nginx"), pytest.param(GATEWAY, id="gateway")])
def test_a_controller_killed_between_any_two_writes_converges_on_the_same_objects(routing: Obj) -> None:
    world = nginx_world if "nginx" in routing else gateway_world
    clean = world()
    expected = _states(clean, routing)
    assert len(clean.writes) >= 8
    for at in range(len(clean.writes)):
        kube = crash_before_write(MemoryKube(*world().objects()), at)
        assert _states(kube, routing) == expected, f"killed before write {at}"


def defaulting(*objects: Obj) -> MemoryKube:
    """Stores HTTPRoutes with the upstream CRD's defaults filled in, as a real Gateway API install does."""

    def admit(obj: Obj) -> Obj:
        if obj.get("kind") == "HTTPRoute":
            obj = merge(obj, {"spec": {"rules": normal_rules(obj["spec"].get("rules") or [])}})
        return obj

    kube = MemoryKube()
    kube.admit = admit
    for obj in objects:
        kube.put(obj)
    return kube


def test_gateway_router_does_not_rewrite_a_route_the_api_server_defaulted() -> None:
    kube = defaulting(route({"backendRefs": [ref("web")]}), service(), *STABLE)
    router = make_router(kube, GATEWAY)
    router.prepare(STABLE_HASH)
    router.set_weight(30, HDR)
    kube.requests.clear()
    router.set_weight(30, HDR)
    assert writes(kube) == []
    router.set_weight(0)
    router.reset()
    assert (kube.get(ROUTE) or {})["spec"]["rules"] == normal_rules([{"backendRefs": [ref("web")]}])
