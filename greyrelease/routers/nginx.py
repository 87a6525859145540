"""nginx mode: a canary Ingress the way ingress-nginx expects it.

ingress-nginx splits traffic between two Ingresses for the same host and path: the user's (the "main"
one) and a second one annotated ``<prefix>/canary: "true"``, whose backend gets ``canary-weight``
percent of the requests (0-100), or every request carrying the header named by ``canary-by-header``
with the value in ``canary-by-header-value`` (header rules are evaluated before the weight). Everything
else goes to the main Ingress's backend.

So the release needs, next to the user's Ingress and Service (which it never rewrites beyond the
selector narrowing):

- ``<stableService>-canary``, a Service selecting only the canary pods (:mod:`.canary_service`);
- ``<ingress>-canary``, a copy of the user's Ingress restricted to the paths that reach the stable
  Service, pointing at the canary Service instead, with the canary annotations;
- the stable Service narrowed to the stable ReplicaSet (:mod:`.selector`): the canary pods copy the
  labels it selects on, so without it the "stable" share would partly reach the canary.

ingress-nginx matches one header per canary Ingress, so a batch's ``headerMatch`` may name one header
only; :meth:`NginxRouter.problem` refuses more before anything is touched.
"""

from __future__ import annotations

import copy

from greyrelease.api.release import RELEASE_LABEL, GreyReleaseSpec, NginxRouting, Obj
from greyrelease.kube.protocol import Kube, path
from greyrelease.kube.workload import CANARY_SUFFIX
from greyrelease.planner.images import label_value
from greyrelease.routers.canary_service import (
    CanaryService,
    canary_service_name,
    foreign,
    owned_by,
    stable_hash_or_raise,
)
from greyrelease.routers.selector import ServiceSelector

#: Some installations still pick the controller by this annotation instead of spec.ingressClassName;
#: the canary Ingress must be served by the same controller as the main one.
INGRESS_CLASS_ANNOTATION = "kubernetes.io/ingress.class"


def canary_ingress_name(ingress: str) -> str:
    return ingress + CANARY_SUFFIX


def _routes_to(path_: Obj, service: str) -> bool:
    return bool(path_.get("backend", {}).get("service", {}).get("name") == service)


def canary_rules(ingress: Obj, *, stable_service: str, canary_service: str) -> list[Obj]:
    """The user's rules cut down to the paths whose backend is ``stable_service``, sent to the canary.

    ingress-nginx pairs a canary Ingress with the main one by host and path, so hosts, paths and path
    types are kept as written; only the backend's Service name changes (the port, by number or name,
    exists on the canary Service too, which copies the stable's ports).
    """
    out: list[Obj] = []
    for rule in ingress.get("spec", {}).get("rules") or []:
        paths = [p for p in (rule.get("http") or {}).get("paths") or [] if _routes_to(p, stable_service)]
        if not paths:
            continue
        new_paths = []
        for p in paths:
            p = copy.deepcopy(p)
            p["backend"]["service"]["name"] = canary_service
            new_paths.append(p)
        new_rule = {k: copy.deepcopy(v) for k, v in rule.items() if k != "http"}
        new_rule["http"] = {"paths": new_paths}
        out.append(new_rule)
    return out


def canary_annotations(prefix: str, weight: int, header_match: dict[str, str] | None) -> dict[str, str | None]:
    """The annotations that set the canary's share; None marks one to remove.

    >>> canary_annotations("p", 20, {"x-canary": "yes"})
    {'p/canary': 'true', 'p/canary-weight': '20', 'p/canary-by-header': 'x-canary', 'p/canary-by-header-value': 'yes'}

    Weight 0 also drops the header rule: 0 is the abort, and a header would keep feeding the canary.
    """
    header, value = None, None
    if weight > 0 and header_match:
        ((header, value),) = header_match.items()
    return {
        f"{prefix}/canary": "true",
        f"{prefix}/canary-weight": str(weight),
        f"{prefix}/canary-by-header": header,
        f"{prefix}/canary-by-header-value": value,
    }


def build_canary_ingress(
    ingress: Obj,
    *,
    stable_service: str,
    prefix: str,
    weight: int,
    header_match: dict[str, str] | None,
    owner: Obj,
) -> Obj:
    """The canary Ingress for the user's ``ingress``: same class, hosts and TLS; canary backend only."""
    meta, spec = ingress["metadata"], ingress.get("spec", {})
    annotations = {k: v for k, v in canary_annotations(prefix, weight, header_match).items() if v is not None}
    user_class = (meta.get("annotations") or {}).get(INGRESS_CLASS_ANNOTATION)
    if user_class is not None:
        annotations[INGRESS_CLASS_ANNOTATION] = user_class
    canary_service = canary_service_name(stable_service)
    body_spec: Obj = {"rules": canary_rules(ingress, stable_service=stable_service, canary_service=canary_service)}
    for key in ("ingressClassName", "tls"):
        if key in spec:
            body_spec[key] = copy.deepcopy(spec[key])
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {
            "name": canary_ingress_name(meta["name"]),
            "namespace": meta.get("namespace"),
            "labels": {RELEASE_LABEL: label_value(owner["name"]) or "release"},
            "annotations": annotations,
            "ownerReferences": [owner],
        },
        "spec": body_spec,
    }


def annotations_patch(existing: Obj, wanted: dict[str, str | None]) -> Obj:
    """The annotations of ``wanted`` that ``existing`` does not have yet (None removes a present one)."""
    have = existing.get("metadata", {}).get("annotations") or {}
    return {k: v for k, v in wanted.items() if have.get(k) != v and (v is not None or k in have)}


def ingress_patch(existing: Obj, desired: Obj, prefix: str) -> Obj | None:
    """The merge patch that makes ``existing`` the ``desired`` canary Ingress; None when equal."""
    wanted: dict[str, str | None] = dict(desired["metadata"]["annotations"])
    for key in canary_annotations(prefix, 0, None):
        wanted.setdefault(key, None)
    if INGRESS_CLASS_ANNOTATION not in wanted:
        wanted[INGRESS_CLASS_ANNOTATION] = None
    patch: Obj = {}
    if annotations := annotations_patch(existing, wanted):
        patch["metadata"] = {"annotations": annotations}
    have_spec = existing.get("spec", {})
    spec = {k: v for k, v in desired["spec"].items() if have_spec.get(k) != v}
    spec.update({k: None for k in ("ingressClassName", "tls") if k in have_spec and k not in desired["spec"]})
    if spec:
        patch["spec"] = spec
    return patch or None


def ingress_problem(ingress: Obj | None, *, name: str, stable_service: str) -> str:
    if ingress is None:
        return f"spec.trafficRouting.nginx.ingress: Ingress {name!r} not found"
    if not canary_rules(ingress, stable_service=stable_service, canary_service=""):
        return f"spec.trafficRouting.nginx: Ingress {name!r} has no path to Service {stable_service!r}"
    return ""


def header_problem(spec: GreyReleaseSpec) -> str:
    for i, batch in enumerate(spec.batches or []):
        if batch.header_match and len(batch.header_match) > 1:
            return f"spec.batches[{i}].headerMatch: ingress-nginx matches one header per canary; name one"
    return ""


class NginxRouter:
    def __init__(
        self,
        kube: Kube,
        *,
        namespace: str,
        routing: NginxRouting,
        spec: GreyReleaseSpec,
        owner: Obj,
    ) -> None:
        self.kube = kube
        self.routing = routing
        self.spec = spec
        self.owner = owner
        self.prefix = routing.annotation_prefix.rstrip("/")
        self.ingress_path = path("networking.k8s.io", "v1", "ingresses", namespace, routing.ingress)
        self.canary_name = canary_ingress_name(routing.ingress)
        self.canary_path = path("networking.k8s.io", "v1", "ingresses", namespace, self.canary_name)
        self.ingresses = path("networking.k8s.io", "v1", "ingresses", namespace)
        self.stable = ServiceSelector(kube, namespace=namespace, name=routing.stable_service)
        self.canary_service = CanaryService(
            kube, namespace=namespace, stable_service=routing.stable_service, owner=owner
        )

    def _ours(self, obj: Obj) -> bool:
        return owned_by(obj, self.owner["uid"])

    def problem(self) -> str:
        ingress = self.kube.get(self.ingress_path)
        found = ingress_problem(ingress, name=self.routing.ingress, stable_service=self.routing.stable_service)
        if found:
            return found
        if self.stable.get() is None:
            return f"spec.trafficRouting.nginx.stableService: Service {self.routing.stable_service!r} not found"
        for refusal in (
            foreign("Ingress", self.kube.get(self.canary_path), self.owner["uid"]),
            self.canary_service.problem(),
        ):
            if refusal:
                return f"spec.trafficRouting.nginx: {refusal}"
        return header_problem(self.spec)

    def _ensure(self, weight: int, header_match: dict[str, str] | None) -> None:
        """Canary Service and canary Ingress exist as desired at ``weight``."""
        ingress = self.kube.get(self.ingress_path)
        stable = self.stable.get()
        if ingress is None or stable is None:
            raise RuntimeError(
                ingress_problem(ingress, name=self.routing.ingress, stable_service=self.routing.stable_service)
                or f"Service {self.routing.stable_service!r} not found"
            )
        self.canary_service.ensure(stable)
        desired = build_canary_ingress(
            ingress,
            stable_service=self.routing.stable_service,
            prefix=self.prefix,
            weight=weight,
            header_match=header_match,
            owner=self.owner,
        )
        existing = self.kube.get(self.canary_path)
        if existing is None:
            self.kube.create(self.ingresses, desired)
            return
        if not self._ours(existing):
            raise RuntimeError(foreign("Ingress", existing, self.owner["uid"]))
        if (patch := ingress_patch(existing, desired, self.prefix)) is not None:
            self.kube.patch(self.canary_path, patch)

    def prepare(self, stable_hash: str) -> None:
        self._ensure(0, None)
        # Before any canary pod exists: the stable backend must never reach one.
        self.stable.narrow(stable_hash_or_raise(stable_hash, self.routing.stable_service))

    def set_weight(self, weight: int, header_match: dict[str, str] | None = None, *, stable_hash: str = "") -> None:
        if weight > 0:
            self._ensure(weight, header_match)
            return
        # Weight 0 is the abort: one read, one patch at most, and nothing created. An Ingress that is
        # not ours is left alone: it gets no traffic from us, and refusing here would block the abort.
        existing = self.kube.get(self.canary_path)
        if existing is None or not self._ours(existing):
            return
        if annotations := annotations_patch(existing, canary_annotations(self.prefix, 0, None)):
            self.kube.patch(self.canary_path, {"metadata": {"annotations": annotations}})

    def restore_stable_selector(self) -> None:
        self.stable.restore()

    def reset(self) -> None:
        # The canary Ingress goes first, so no request is routed to a Service that is being deleted.
        existing = self.kube.get(self.canary_path)
        if existing is not None and self._ours(existing):
            self.kube.delete(self.canary_path)
        self.canary_service.delete()
        self.stable.restore()

    def canary_endpoints(self) -> int:
        return self.canary_service.ready_endpoints()
