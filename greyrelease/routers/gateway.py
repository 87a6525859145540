"""Gateway API mode: weights on the backendRefs of the user's HTTPRoute.

An HTTPRoute rule sends each request to one of its ``backendRefs``, chosen in proportion to their
``weight`` (default 1; 0 means never). So in every rule that routes to the stable Service the release
keeps two refs: the stable one at ``100 - w`` and ``<stableService>-canary`` at ``w`` (a copy of the
stable ref, same port and filters). When the rule also routes to other Services, their share is kept:
every weight is multiplied by 100 and the stable's part is split ``(100 - w) : w``.

Header routing (a batch's ``headerMatch``) adds, first in the list, one rule per stable rule with the
same matches plus the headers (type Exact) and only the canary as backend. Gateway API ranks matches by
specificity (path, method, then the number of header matches) before rule order, so a copy of the
user's match with more headers wins over it, whatever the path.

The rules exactly as the user wrote them are saved as JSON in ``greyrelease.io/original-rules`` on the
HTTPRoute, in the same patch as the first change; every later state is computed from that copy (so a
repeated or resumed pass converges on the same list), and :meth:`GatewayRouter.reset` writes it back.
Rules are a list, which a JSON merge patch replaces whole: each write sends the full desired list with
``metadata.resourceVersion``, so an edit by someone else in between makes the API server answer 409
Conflict instead of being overwritten; the pass fails and the next one starts from a fresh read. Edits
to the rules made while a release runs are replaced by the saved rules at its end: edit the route
before or after a release.
"""

from __future__ import annotations

import copy
import json

from greyrelease.api.release import GatewayRouting, Obj
from greyrelease.kube.protocol import Kube, path
from greyrelease.routers.canary_service import CanaryService, canary_service_name, stable_hash_or_raise
from greyrelease.routers.selector import ServiceSelector

ORIGINAL_RULES_ANNOTATION = "greyrelease.io/original-rules"
#: Gateway API caps a backendRef weight at 1,000,000.
MAX_WEIGHT = 1_000_000


def _is_service_ref(ref: Obj, service: str, namespace: str) -> bool:
    return (
        ref.get("name") == service
        and (ref.get("group") or "") == ""
        and (ref.get("kind") or "Service") == "Service"
        and ref.get("namespace", namespace) == namespace
    )


def routes_to(rule: Obj, service: str, namespace: str) -> bool:
    return any(_is_service_ref(r, service, namespace) for r in rule.get("backendRefs") or [])


def _weighted_refs(refs: list[Obj], *, service: str, canary: str, namespace: str, weight: int) -> list[Obj]:
    """``refs`` with the stable split ``(100 - weight) : weight`` between itself and the canary.

    Alone in its rule: stable 100 - w, canary w (w=20 -> 80/20). Beside other backends (stable 1,
    other 1, w=20): stable 80, canary 20, other 100, so the other keeps its half.
    """
    alone = all(_is_service_ref(r, service, namespace) for r in refs)
    out: list[Obj] = []
    for ref in refs:
        own = int(ref.get("weight", 1))
        if not _is_service_ref(ref, service, namespace):
            out.append({**copy.deepcopy(ref), "weight": own * 100})
            continue
        scale = 1 if alone else own
        out.append({**copy.deepcopy(ref), "weight": scale * (100 - weight)})
        out.append({**copy.deepcopy(ref), "name": canary, "weight": scale * weight})
    return out


def _with_headers(match: Obj, headers: dict[str, str]) -> Obj:
    out = copy.deepcopy(match)
    names = {h.lower() for h in headers}
    # HTTP header names are case-insensitive: ours replace any the user matched on already.
    kept = [h for h in out.get("headers") or [] if str(h.get("name", "")).lower() not in names]
    out["headers"] = kept + [{"type": "Exact", "name": k, "value": v} for k, v in sorted(headers.items())]
    return out


def _header_rule(rule: Obj, *, service: str, canary: str, namespace: str, headers: dict[str, str]) -> Obj:
    """A copy of ``rule`` for requests with ``headers``, sent to the canary only."""
    out = {k: copy.deepcopy(v) for k, v in rule.items() if k not in ("name", "matches", "backendRefs")}
    out["matches"] = [_with_headers(m, headers) for m in rule.get("matches") or [{}]]
    stable = next(r for r in rule["backendRefs"] if _is_service_ref(r, service, namespace))
    ref = {k: copy.deepcopy(v) for k, v in stable.items() if k != "weight"}
    ref["name"] = canary
    out["backendRefs"] = [ref]
    return out


def weighted_rules(
    original: list[Obj],
    *,
    service: str,
    namespace: str,
    weight: int,
    header_match: dict[str, str] | None = None,
) -> list[Obj]:
    """The rules of the route with the canary at ``weight``. Pure; ``original`` is not changed."""
    canary = canary_service_name(service)
    header_rules: list[Obj] = []
    rules: list[Obj] = []
    for rule in original:
        if not routes_to(rule, service, namespace):
            rules.append(copy.deepcopy(rule))
            continue
        new = copy.deepcopy(rule)
        new["backendRefs"] = _weighted_refs(
            rule["backendRefs"], service=service, canary=canary, namespace=namespace, weight=weight
        )
        rules.append(new)
        if weight > 0 and header_match:
            header_rules.append(
                _header_rule(rule, service=service, canary=canary, namespace=namespace, headers=header_match)
            )
    return header_rules + rules


# --- comparing what the API server stored with what we want --------------------------------------


def _normal_ref(ref: Obj) -> Obj:
    return {"group": "", "kind": "Service", "weight": 1, **ref}


def _normal_match(match: Obj) -> Obj:
    out = dict(match)
    out["path"] = {"type": "PathPrefix", "value": "/", **(match.get("path") or {})}
    if "headers" in match:
        out["headers"] = [{"type": "Exact", **h} for h in match["headers"]]
    return out


def normal_rules(rules: list[Obj]) -> list[Obj]:
    """``rules`` with the Gateway API defaults filled in, so that a route stored by an API server that
    applies them (the upstream CRD does) compares equal to the list we built without them."""
    out = []
    for rule in rules:
        r = dict(rule)
        r["matches"] = [_normal_match(m) for m in rule.get("matches") or [{}]]
        r["backendRefs"] = [_normal_ref(b) for b in rule.get("backendRefs") or []]
        out.append(r)
    return out


def saved_rules(route: Obj) -> list[Obj] | None:
    saved = (route.get("metadata", {}).get("annotations") or {}).get(ORIGINAL_RULES_ANNOTATION)
    return None if saved is None else list(json.loads(saved))


def weight_patch(route: Obj, *, service: str, weight: int, header_match: dict[str, str] | None = None) -> Obj | None:
    """The merge patch that puts the canary of ``route`` at ``weight``; None when it is there already."""
    meta = route.get("metadata", {})
    current = list(route.get("spec", {}).get("rules") or [])
    original = saved_rules(route)
    annotations: Obj = {}
    if original is None:
        original = current
        annotations[ORIGINAL_RULES_ANNOTATION] = json.dumps(current, sort_keys=True, separators=(",", ":"))
    desired = weighted_rules(
        original, service=service, namespace=meta.get("namespace", ""), weight=weight, header_match=header_match
    )
    if not annotations and normal_rules(current) == normal_rules(desired):
        return None
    patch_meta: Obj = {"resourceVersion": meta.get("resourceVersion")}
    if annotations:
        patch_meta["annotations"] = annotations
    return {"metadata": patch_meta, "spec": {"rules": desired}}


def restore_patch(route: Obj) -> Obj | None:
    """The merge patch that gives ``route`` back the rules the user wrote; None when never changed."""
    original = saved_rules(route)
    if original is None:
        return None
    meta = route.get("metadata", {})
    return {
        "metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": {ORIGINAL_RULES_ANNOTATION: None}},
        "spec": {"rules": original},
    }


def route_problem(route: Obj | None, *, name: str, service: str) -> str:
    if route is None:
        return f"spec.trafficRouting.gatewayAPI.httpRoute: HTTPRoute {name!r} not found"
    namespace = route.get("metadata", {}).get("namespace", "")
    rules = saved_rules(route)
    if rules is None:
        rules = list(route.get("spec", {}).get("rules") or [])
        canary = canary_service_name(service)
        if any(routes_to(r, canary, namespace) for r in rules):
            return f"spec.trafficRouting.gatewayAPI: HTTPRoute {name!r} already routes to Service {canary!r}"
    stable_rules = [r for r in rules if routes_to(r, service, namespace)]
    if not stable_rules:
        return f"spec.trafficRouting.gatewayAPI: HTTPRoute {name!r} has no backendRef to Service {service!r}"
    for rule in stable_rules:
        refs = rule["backendRefs"]
        # Beside other backends every weight is multiplied by 100 (see _weighted_refs).
        if len(refs) > 1 and any(int(r.get("weight", 1)) * 100 > MAX_WEIGHT for r in refs):
            return f"spec.trafficRouting.gatewayAPI: HTTPRoute {name!r} has weights above {MAX_WEIGHT // 100}"
    return ""


class GatewayRouter:
    def __init__(
        self,
        kube: Kube,
        *,
        namespace: str,
        routing: GatewayRouting,
        owner: Obj,
    ) -> None:
        self.kube = kube
        self.routing = routing
        self.route_path = path("gateway.networking.k8s.io", "v1", "httproutes", namespace, routing.http_route)
        self.stable = ServiceSelector(kube, namespace=namespace, name=routing.stable_service)
        self.canary_service = CanaryService(
            kube, namespace=namespace, stable_service=routing.stable_service, owner=owner
        )

    def _route(self) -> Obj:
        route = self.kube.get(self.route_path)
        if problem := route_problem(route, name=self.routing.http_route, service=self.routing.stable_service):
            raise RuntimeError(problem)
        assert route is not None
        return route

    def problem(self) -> str:
        route = self.kube.get(self.route_path)
        if found := route_problem(route, name=self.routing.http_route, service=self.routing.stable_service):
            return found
        if self.stable.get() is None:
            return f"spec.trafficRouting.gatewayAPI.stableService: Service {self.routing.stable_service!r} not found"
        if refusal := self.canary_service.problem():
            return f"spec.trafficRouting.gatewayAPI: {refusal}"
        return ""

    def _set(self, route: Obj, weight: int, header_match: dict[str, str] | None) -> None:
        patch = weight_patch(route, service=self.routing.stable_service, weight=weight, header_match=header_match)
        if patch is not None:
            self.kube.patch(self.route_path, patch)

    def prepare(self, stable_hash: str) -> None:
        stable = self.stable.get()
        if stable is None:
            raise RuntimeError(f"Service {self.routing.stable_service!r} not found")
        route = self._route()
        # The canary Service exists before the route names it, so the Gateway never has a dangling ref.
        self.canary_service.ensure(stable)
        self._set(route, 0, None)
        self.stable.narrow(stable_hash_or_raise(stable_hash, self.routing.stable_service))

    def set_weight(self, weight: int, header_match: dict[str, str] | None = None, *, stable_hash: str = "") -> None:
        route = self.kube.get(self.route_path)
        if route is None:
            if weight > 0:
                raise RuntimeError(f"HTTPRoute {self.routing.http_route!r} not found")
            return
        if weight == 0 and saved_rules(route) is None:
            return  # never prepared: nothing routes to the canary, and an abort adds nothing
        if weight > 0:
            stable = self.stable.get()
            if stable is not None:
                self.canary_service.ensure(stable)
        self._set(route, weight, header_match)

    def restore_stable_selector(self) -> None:
        self.stable.restore()

    def reset(self) -> None:
        # The route first: once it no longer names the canary Service, that Service can go.
        route = self.kube.get(self.route_path)
        if route is not None and (patch := restore_patch(route)) is not None:
            self.kube.patch(self.route_path, patch)
        self.canary_service.delete()
        self.stable.restore()

    def canary_endpoints(self) -> int:
        return self.canary_service.ready_endpoints()
