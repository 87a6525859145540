"""An API server in memory: :class:`MemoryKube`, the :class:`~greyrelease.kube.protocol.Kube` every unit test
runs the reconciler, the routers and the cache on.

In the spirit of httpx's MockTransport: resourceVersions, 404 and 409, generations, the status subresource,
finalizers and deletion marks, JSON merge patches and the strategic merge patches the controller sends. It
is a real implementation of the semantics the controller relies on, not a recording stub, so a test that
passes on it exercises the same code paths as the controller does against a cluster.
"""

from __future__ import annotations

import copy
import itertools
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from greyrelease.api.release import Obj
from greyrelease.kube.protocol import MERGE, STRATEGIC, ApiError, Conflict, Location, NotFound, parse, path, selects

# --- patches -----------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge, null removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


#: Lists a strategic merge patch merges item by item, by this key (Kubernetes' patchMergeKey); other
#: lists are replaced whole, as in a merge patch. Only the lists of a pod template are listed: those are
#: the ones the controller patches this way (a container's image in a Deployment).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
}


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch as the API server applies it to the fields in :data:`MERGE_KEYS`
    (no ``$patch`` directives: the controller sends none)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif k in MERGE_KEYS and isinstance(v, list) and isinstance(out.get(k), list):
            key = MERGE_KEYS[k]
            items = [copy.deepcopy(i) for i in out[k]]
            for item in v:
                at = next((n for n, have in enumerate(items) if have.get(key) == item.get(key)), None)
                if at is None:
                    items.append(copy.deepcopy(item))
                else:
                    items[at] = strategic_merge_patch(items[at], item)
            out[k] = items
        else:
            out[k] = strategic_merge_patch(out.get(k), v)
    return out


# --- the in-memory API server ------------------------------------------------------------------------


def without_nulls(value: Any) -> Any:
    """``value`` without null fields, at any depth: what the API server keeps (a built-in type's field
    decoded from null is omitted, and a CRD's structural schema drops nulls in fields not nullable)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class MemoryKube:
    """A :class:`Kube` that keeps objects in memory and answers as an API server does.

    - Every write gives the object a new ``resourceVersion`` (one counter for all, as etcd's revision);
      a create gives it a ``uid``, ``creationTimestamp`` and ``generation`` 1, and a write that changes
      its ``spec`` bumps ``generation``.
    - A write to an object ignores its ``status``; a write to ``<object>/status`` changes only that.
    - GET of a missing object is None, PATCH or PUT of one is :class:`NotFound`, CREATE of a name taken is
      :class:`Conflict`, and so is a write whose ``metadata.resourceVersion`` is not the current one.
    - DELETE of an object with finalizers (or in the foreground, which adds ``foregroundDeletion``) marks
      it with ``deletionTimestamp``; it goes when its last finalizer is removed (:meth:`collect` removes
      ``foregroundDeletion``, as the garbage collector does once the dependents are gone).
    - No null field is kept, nor empty ``labels``, ``annotations`` or ``finalizers`` (the API server
      omits them).

    ``requests`` logs every call as ``(verb, path)``; :attr:`writes` are those that write. ``before``,
    when set, is called with the verb and path before each call is served and may raise (an error from the
    API server, or a crash of the controller at that point). ``admit``, when set, is given every object
    about to be stored and returns what to store (the defaults a real API server or a CRD fills in).
    :meth:`put` stores an object as another client would (status included).
    """

    WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")

    def __init__(self, *objects: Obj) -> None:
        self._lock = threading.RLock()
        self._objects: dict[tuple[str, str, str, str], Obj] = {}
        self._versions = itertools.count(1)
        self.requests: list[tuple[str, str]] = []
        self.before: Callable[[str, str], None] | None = None
        self.admit: Callable[[Obj], Obj] | None = None
        for obj in objects:
            self.put(obj)

    # --- seeding and inspecting (as other clients and controllers would) ----------------------------

    @staticmethod
    def path_of(obj: Obj) -> str:
        """The path of ``obj`` from its apiVersion, kind and metadata (for the kinds tests use)."""
        group, _, version = str(obj["apiVersion"]).rpartition("/")
        kind = str(obj["kind"])
        lower = kind.lower()
        plural = {"endpoints": "endpoints"}.get(lower) or (
            lower[:-1] + "ies" if lower.endswith("y") else lower + "es" if lower.endswith("s") else lower + "s"
        )
        meta = obj["metadata"]
        return path(group, version, plural, meta.get("namespace"), meta["name"])

    def put(self, obj: Obj) -> Obj:
        """Store ``obj`` as given (status too), creating or replacing it; what was stored."""
        loc = self._locate(self.path_of(obj))
        with self._lock:
            held = self._objects.get(self._key(loc))
            new = copy.deepcopy(obj)
            meta = new.setdefault("metadata", {})
            if held is None:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", _now())
                meta.setdefault("generation", 1)
            else:
                for k in ("uid", "creationTimestamp"):
                    meta.setdefault(k, held["metadata"].get(k))
                meta.setdefault("generation", held["metadata"].get("generation", 1))
            return self._store(loc, new)

    @property
    def writes(self) -> list[tuple[str, str]]:
        """The write requests so far, as ``(verb, path)``; a POST's path is its collection's."""
        with self._lock:
            return [(verb, p) for verb, p in self.requests if verb in self.WRITE_VERBS]

    def objects(self, collection: str | None = None) -> list[Obj]:
        """Copies of every object (under ``collection``, a path prefix, when given)."""
        with self._lock:
            found = [(self._path(k), o) for k, o in self._objects.items()]
        return [copy.deepcopy(o) for p, o in found if collection is None or p.startswith(collection + "/")]

    def collect(self) -> None:
        """Finish foreground deletions, as the garbage collector does once the dependents are gone."""
        with self._lock:
            for key, obj in list(self._objects.items()):
                finalizers = obj["metadata"].get("finalizers") or []
                if obj["metadata"].get("deletionTimestamp") and "foregroundDeletion" in finalizers:
                    rest = [f for f in finalizers if f != "foregroundDeletion"]
                    if rest:
                        obj["metadata"]["finalizers"] = rest
                    else:
                        del self._objects[key]

    # --- Kube ---------------------------------------------------------------------------------------

    def get(self, path: str) -> Obj | None:
        loc = self._serve("GET", path)
        with self._lock:
            found = self._objects.get(self._key(loc))
            return copy.deepcopy(found) if found is not None else None

    def list(self, path: str, *, label_selector: str | None = None) -> list[Obj]:
        loc = self._serve("LIST", path)
        with self._lock:
            found = [
                copy.deepcopy(o)
                for (api, plural, ns, _), o in sorted(self._objects.items())
                if (api, plural) == loc.collection
                and (not loc.namespace or ns == loc.namespace)
                and selects(label_selector, o["metadata"].get("labels") or {})
            ]
        return found

    def create(self, path: str, body: Obj) -> Obj:
        loc = self._serve("POST", path)
        name = (body.get("metadata") or {}).get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        target = Location(loc.api, loc.plural, loc.namespace, name)
        with self._lock:
            if self._key(target) in self._objects:
                raise Conflict(409, "AlreadyExists", f'{loc.plural} "{name}" already exists')
            new = copy.deepcopy(body)
            new.pop("status", None)
            meta = new.setdefault("metadata", {})
            if loc.namespace:
                meta["namespace"] = loc.namespace
            for k in ("resourceVersion", "deletionTimestamp"):
                meta.pop(k, None)
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
            return self._store(target, new)

    def patch(self, path: str, body: Obj, *, patch_type: str = MERGE) -> Obj:
        loc = self._serve("PATCH", path)
        apply = strategic_merge_patch if patch_type == STRATEGIC else merge_patch
        with self._lock:
            held = self._held(loc)
            self._precondition(held, body)
            if loc.sub == "status":
                new = copy.deepcopy(held)
                patched = apply({"status": held.get("status")}, {"status": body.get("status")})
                new["status"] = patched.get("status")
                if new["status"] is None:
                    new.pop("status")
            else:
                new = apply(held, {k: v for k, v in body.items() if k != "status"})
            return self._write(loc, held, new)

    def replace(self, path: str, body: Obj) -> Obj:
        loc = self._serve("PUT", path)
        with self._lock:
            held = self._held(loc)
            self._precondition(held, body)
            new = copy.deepcopy(body)
            if loc.sub == "status":
                new = {**copy.deepcopy(held), "status": new.get("status")}
            elif "status" in held:
                new["status"] = copy.deepcopy(held["status"])
            else:
                new.pop("status", None)
            return self._write(loc, held, new)

    def delete(self, path: str, *, propagation: str = "Background") -> Obj | None:
        loc = self._serve("DELETE", path)
        with self._lock:
            held = self._objects.get(self._key(loc))
            if held is None:
                return None
            finalizers = list(held["metadata"].get("finalizers") or [])
            if propagation == "Foreground" and "foregroundDeletion" not in finalizers:
                finalizers.append("foregroundDeletion")
            if not finalizers:
                gone = self._objects.pop(self._key(loc))
                gone["metadata"]["resourceVersion"] = str(next(self._versions))  # the deletion's revision
                return copy.deepcopy(gone)
            if held["metadata"].get("deletionTimestamp"):
                return copy.deepcopy(held)
            new = copy.deepcopy(held)
            new["metadata"].update(finalizers=finalizers, deletionTimestamp=_now())
            return self._store(loc, new)

    # --- inside -------------------------------------------------------------------------------------

    @staticmethod
    def _locate(p: str) -> Location:
        loc = parse(p)
        if loc is None:
            raise ApiError(404, "NotFound", f"no such path {p}")
        return loc

    @staticmethod
    def _key(loc: Location) -> tuple[str, str, str, str]:
        return loc.api, loc.plural, loc.namespace, loc.name

    @staticmethod
    def _path(key: tuple[str, str, str, str]) -> str:
        api, plural, ns, name = key
        return api + (f"/namespaces/{quote(ns)}" if ns else "") + f"/{plural}/{quote(name)}"

    def _serve(self, verb: str, p: str) -> Location:
        with self._lock:
            self.requests.append((verb, p))
        if self.before is not None:
            self.before(verb, p)
        return self._locate(p)

    def _held(self, loc: Location) -> Obj:
        held = self._objects.get(self._key(loc))
        if held is None:
            raise NotFound(404, "NotFound", f'{loc.plural} "{loc.name}" not found')
        return held

    @staticmethod
    def _precondition(held: Obj, body: Obj) -> None:
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want is not None and str(want) != held["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", "the object has been modified; apply your changes to the latest version")

    def _write(self, loc: Location, held: Obj, new: Obj) -> Obj:
        meta = new.setdefault("metadata", {})
        for k in ("uid", "creationTimestamp", "deletionTimestamp", "namespace", "name"):
            if k in held["metadata"]:
                meta[k] = held["metadata"][k]
        generation = int(held["metadata"].get("generation", 1))
        meta["generation"] = generation + (1 if new.get("spec") != held.get("spec") else 0)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self._objects[self._key(loc)]  # the last finalizer removed: the object goes
            out = copy.deepcopy(new)
            out["metadata"]["resourceVersion"] = str(next(self._versions))
            return out
        return self._store(loc, new)

    def _store(self, loc: Location, obj: Obj) -> Obj:
        if self.admit is not None:
            obj = self.admit(obj)
        obj = without_nulls(obj)
        meta = obj["metadata"]
        meta["name"] = loc.name
        if loc.namespace:
            meta["namespace"] = loc.namespace
        for k in ("labels", "annotations", "finalizers"):
            if k in meta and not meta[k]:
                del meta[k]
        meta["resourceVersion"] = str(next(self._versions))
        self._objects[self._key(loc)] = obj
        return copy.deepcopy(obj)
