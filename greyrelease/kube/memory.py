"""An API server in memory: :class:`MemoryKube`, the :class:`~greyrelease.kube.protocol.Kube` every unit test
runs the reconciler, the routers and the cache on.

In the spirit of httpx's MockTransport: resourceVersions, 404 and 409, generations, the status subresource,
finalizers and deletion marks, JSON merge patches, the strategic merge patches and JSON patches (RFC 6902)
the controller sends, and the field manager each patch was sent with. It
is a real implementation of the semantics the controller relies on, not a recording stub, so a test that
passes on it exercises the same code paths as the controller does against a cluster.
"""

from __future__ import annotations

import base64
import copy
import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from greyrelease.api.release import Obj
from greyrelease.kube.protocol import (
    JSON_PATCH,
    MERGE,
    STRATEGIC,
    ApiError,
    Conflict,
    NotFound,
    PatchBody,
    Ref,
    path,
    selects,
)

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


class PatchError(ValueError):
    """A JSON patch that cannot be applied (a path that is not there, a ``test`` that does not hold)."""


def _pointer(text: str) -> list[str]:
    """A JSON Pointer (RFC 6901) as its segments: ``/metadata/annotations/a~1b`` -> metadata, annotations, a/b."""
    if text == "":
        return []
    if not text.startswith("/"):
        raise PatchError(f"{text!r} is not a JSON pointer")
    return [part.replace("~1", "/").replace("~0", "~") for part in text[1:].split("/")]


def _parent(doc: Any, parts: list[str], op: str) -> tuple[Any, str]:
    """The container of the pointer's last segment, and that segment."""
    if not parts:
        raise PatchError(f"{op}: the whole document is not a target here")
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(f"{op}: /{'/'.join(parts)}: no such path")
    return node, parts[-1]


def _get(doc: Any, parts: list[str], op: str) -> Any:
    node, last = _parent(doc, parts, op) if parts else (None, "")
    if not parts:
        return doc
    if isinstance(node, dict) and last in node:
        return node[last]
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        return node[int(last)]
    raise PatchError(f"{op}: /{'/'.join(parts)}: no such path")


def _add(doc: Any, parts: list[str], value: Any, op: str) -> None:
    node, last = _parent(doc, parts, op)
    if isinstance(node, dict):
        node[last] = copy.deepcopy(value)
    elif isinstance(node, list) and (last == "-" or (last.isdigit() and int(last) <= len(node))):
        node.insert(len(node) if last == "-" else int(last), copy.deepcopy(value))
    else:
        raise PatchError(f"{op}: /{'/'.join(parts)}: no such path")


def _remove(doc: Any, parts: list[str], op: str) -> Any:
    node, last = _parent(doc, parts, op)
    if isinstance(node, dict) and last in node:
        return node.pop(last)
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        return node.pop(int(last))
    raise PatchError(f"{op}: /{'/'.join(parts)}: no such path")


def json_patch(target: Any, operations: list[Obj]) -> Any:
    """RFC 6902: ``operations`` applied in order to a copy of ``target``, all or none. Raises
    :class:`PatchError` for a path that is not there or a ``test`` that does not hold."""
    doc = copy.deepcopy(target)
    for operation in operations:
        op = str(operation.get("op", ""))
        parts = _pointer(str(operation.get("path", "")))
        if op == "add":
            _add(doc, parts, operation.get("value"), op)
        elif op == "remove":
            _remove(doc, parts, op)
        elif op == "replace":
            _remove(doc, parts, op)
            _add(doc, parts, operation.get("value"), op)
        elif op in ("move", "copy"):
            source = _pointer(str(operation.get("from", "")))
            value = _remove(doc, source, op) if op == "move" else copy.deepcopy(_get(doc, source, op))
            _add(doc, parts, value, op)
        elif op == "test":
            if _get(doc, parts, op) != operation.get("value"):
                raise PatchError(f"test: /{'/'.join(parts)}: the value is not {operation.get('value')!r}")
        else:
            raise PatchError(f"unknown operation {op!r}")
    return doc


# --- the in-memory API server ------------------------------------------------------------------------


#: Where :class:`MemoryKube` holds an object: group, version, resource, namespace ("" when none), name.
Key = tuple[str, str, str, str, str]


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

    ``requests`` logs every call as ``(verb, ref)``, the :class:`~greyrelease.kube.protocol.Ref` it was
    given (a test compares them with the references it builds with ``path()``); :attr:`writes` are those
    that write; ``managers`` logs every PATCH as ``(ref, patch type, field manager)``. ``before``, when set,
    is called with the verb and reference before each call is served and may raise (an error from the
    API server, or a crash of the controller at that point). ``admit``, when set, is given every object
    about to be stored and returns what to store (the defaults a real API server or a CRD fills in, or a
    mutating webhook's answer); an :class:`~greyrelease.kube.protocol.ApiError` it raises is the answer
    (a webhook the API server could not call). :meth:`put` stores an object as another client would
    (status included).

    A PATCH with ``dry_run`` is served as the API server serves ``dryRun=All``: patched and admitted as a
    real one (``admit`` included), answered with the object it would store, and nothing stored. It is
    logged as :attr:`DRY_RUN`, not as a write.

    Lists and watches as a client of the API server makes them (:meth:`request` and :meth:`watch`, what a
    :class:`~greyrelease.kube.cache.Reflector` needs): a GET of a collection answers with the items and the
    collection's ``resourceVersion``, with ``labelSelector`` and ``fieldSelector`` (equality on dotted
    fields) honoured; a watch from that version yields ``ADDED``, ``MODIFIED`` and ``DELETED`` events as the
    writes are made. The changes are kept from the first list or watch on (the last :attr:`KEPT_CHANGES`); a
    watch from a version older than that gets 410 Gone as its one event, as from an API server whose watch
    cache has moved on. :meth:`end_watches` ends every open watch.
    """

    WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")
    #: How many changes a watch can be served from.
    KEPT_CHANGES = 10_000
    #: The verb a dry-run PATCH is logged with in ``requests`` (a dry run writes nothing).
    DRY_RUN = "PATCH dryRun"

    def __init__(self, *objects: Obj) -> None:
        self._lock = threading.RLock()
        self._objects: dict[Key, Obj] = {}
        self._version = 0  # of the last write, as etcd's revision
        self.requests: list[tuple[str, Ref]] = []
        self.managers: list[tuple[Ref, str, str | None]] = []
        self.before: Callable[[str, Ref], None] | None = None
        self.admit: Callable[[Obj], Obj] | None = None
        # Changes for watches (resourceVersion, event type, key, object), kept once a list or watch asked.
        self._changes: deque[tuple[int, str, Key, Obj]] | None = None
        self._kept_since = 0  # the first version whose change is kept
        self._changed = threading.Condition(self._lock)
        self._watch_epoch = 0  # bumped by end_watches
        for obj in objects:
            self.put(obj)

    # --- seeding and inspecting (as other clients and controllers would) ----------------------------

    @staticmethod
    def path_of(obj: Obj) -> Ref:
        """The reference of ``obj`` from its apiVersion, kind and metadata (for the kinds tests use)."""
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
        ref = self.path_of(obj)
        with self._lock:
            held = self._objects.get(self._key(ref))
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
            return self._store(ref, new)

    @property
    def writes(self) -> list[tuple[str, Ref]]:
        """The write requests so far, as ``(verb, ref)``; a POST's is its collection's."""
        with self._lock:
            return [(verb, p) for verb, p in self.requests if verb in self.WRITE_VERBS]

    def objects(self, collection: Ref | None = None) -> list[Obj]:
        """Copies of every object (of ``collection`` when given: its kind, and its namespace unless None)."""
        with self._lock:
            found = [(k, o) for k, o in self._objects.items() if collection is None or self._within(k, collection)]
        return [copy.deepcopy(o) for _, o in found]

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
                        gone = copy.deepcopy(obj)
                        gone["metadata"]["resourceVersion"] = self._next_version()
                        self._changed_to("DELETED", key, gone)

    # --- Kube ---------------------------------------------------------------------------------------

    def get(self, ref: Ref) -> Obj | None:
        self._serve("GET", ref)
        with self._lock:
            found = self._objects.get(self._key(ref))
            return copy.deepcopy(found) if found is not None else None

    def list(self, ref: Ref, *, label_selector: str | None = None) -> list[Obj]:
        self._serve("LIST", ref)
        with self._lock:
            found = [
                copy.deepcopy(o)
                for k, o in sorted(self._objects.items())
                if self._within(k, ref) and selects(label_selector, o["metadata"].get("labels") or {})
            ]
        return found

    def create(self, ref: Ref, body: Obj) -> Obj:
        self._serve("POST", ref)
        name = (body.get("metadata") or {}).get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        target = ref.named(name)
        with self._lock:
            if self._key(target) in self._objects:
                raise Conflict(409, "AlreadyExists", f'{ref.resource} "{name}" already exists')
            new = copy.deepcopy(body)
            new.pop("status", None)
            meta = new.setdefault("metadata", {})
            if ref.namespace:
                meta["namespace"] = ref.namespace
            for k in ("resourceVersion", "deletionTimestamp"):
                meta.pop(k, None)
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
            return self._store(target, new)

    def patch(
        self,
        ref: Ref,
        body: PatchBody,
        *,
        patch_type: str = MERGE,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        self._serve(self.DRY_RUN if dry_run else "PATCH", ref)
        with self._lock:
            self.managers.append((ref, patch_type, field_manager))
            held = self._held(ref)
            if isinstance(body, list) or patch_type == JSON_PATCH:
                return self._json_patch(ref, held, body, dry_run=dry_run)
            apply = strategic_merge_patch if patch_type == STRATEGIC else merge_patch
            self._precondition(held, body)
            if ref.subresource == "status":
                new = copy.deepcopy(held)
                patched = apply({"status": held.get("status")}, {"status": body.get("status")})
                new["status"] = patched.get("status")
                if new["status"] is None:
                    new.pop("status")
            else:
                new = apply(held, {k: v for k, v in body.items() if k != "status"})
            return self._write(ref, held, new, dry_run=dry_run)

    def _json_patch(self, ref: Ref, held: Obj, body: PatchBody, *, dry_run: bool = False) -> Obj:
        """A JSON patch: applied to the object as stored (its status only, for the status subresource)."""
        if not isinstance(body, list):
            raise ApiError(400, "BadRequest", "a JSON patch is a list of operations")
        try:
            patched = json_patch(held, body)
        except PatchError as err:
            raise ApiError(422, "Invalid", str(err)) from None
        new = copy.deepcopy(held)
        if ref.subresource == "status":
            if patched.get("status") is None:
                new.pop("status", None)
            else:
                new["status"] = patched["status"]
        else:
            new = {k: v for k, v in patched.items() if k != "status"}
            if "status" in held:
                new["status"] = copy.deepcopy(held["status"])
        return self._write(ref, held, new, dry_run=dry_run)

    def replace(self, ref: Ref, body: Obj) -> Obj:
        self._serve("PUT", ref)
        with self._lock:
            held = self._held(ref)
            self._precondition(held, body)
            new = copy.deepcopy(body)
            if ref.subresource == "status":
                new = {**copy.deepcopy(held), "status": new.get("status")}
            elif "status" in held:
                new["status"] = copy.deepcopy(held["status"])
            else:
                new.pop("status", None)
            return self._write(ref, held, new)

    def delete(self, ref: Ref, *, propagation: str = "Background") -> Obj | None:
        self._serve("DELETE", ref)
        with self._lock:
            held = self._objects.get(self._key(ref))
            if held is None:
                return None
            finalizers = list(held["metadata"].get("finalizers") or [])
            if propagation == "Foreground" and "foregroundDeletion" not in finalizers:
                finalizers.append("foregroundDeletion")
            if not finalizers:
                gone = self._objects.pop(self._key(ref))
                gone["metadata"]["resourceVersion"] = self._next_version()  # the deletion's revision
                self._changed_to("DELETED", self._key(ref), gone)
                return copy.deepcopy(gone)
            if held["metadata"].get("deletionTimestamp"):
                return copy.deepcopy(held)
            new = copy.deepcopy(held)
            new["metadata"].update(finalizers=finalizers, deletionTimestamp=_now())
            return self._store(ref, new)

    # --- inside -------------------------------------------------------------------------------------

    @staticmethod
    def _key(ref: Ref) -> Key:
        """Where an object is held: its kind, namespace and name (a subresource is of the object)."""
        return ref.group, ref.version, ref.resource, ref.namespace or "", ref.name or ""

    @staticmethod
    def _within(key: Key, collection: Ref) -> bool:
        """Whether the object held at ``key`` is of ``collection`` (its namespace's, or any when None)."""
        return key[:3] == collection.gvr and (not collection.namespace or key[3] == collection.namespace)

    def _serve(self, verb: str, ref: Ref) -> None:
        with self._lock:
            self.requests.append((verb, ref))
        if self.before is not None:
            self.before(verb, ref)

    def _held(self, ref: Ref) -> Obj:
        held = self._objects.get(self._key(ref))
        if held is None:
            raise NotFound(404, "NotFound", f'{ref.resource} "{ref.name}" not found')
        return held

    @staticmethod
    def _precondition(held: Obj, body: Obj) -> None:
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want is not None and str(want) != held["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", "the object has been modified; apply your changes to the latest version")

    def _write(self, ref: Ref, held: Obj, new: Obj, *, dry_run: bool = False) -> Obj:
        if dry_run:
            new = copy.deepcopy(new)  # a merge patch's result shares the maps it left alone with the object held
        meta = new.setdefault("metadata", {})
        for k in ("uid", "creationTimestamp", "deletionTimestamp", "namespace", "name"):
            if k in held["metadata"]:
                meta[k] = held["metadata"][k]
        generation = int(held["metadata"].get("generation", 1))
        meta["generation"] = generation + (1 if new.get("spec") != held.get("spec") else 0)
        if dry_run:
            return self._store(ref, new, dry_run=True)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self._objects[self._key(ref)]  # the last finalizer removed: the object goes
            out = copy.deepcopy(new)
            out["metadata"]["resourceVersion"] = self._next_version()
            self._changed_to("DELETED", self._key(ref), out)
            return copy.deepcopy(out)
        return self._store(ref, new)

    def _store(self, ref: Ref, obj: Obj, *, dry_run: bool = False) -> Obj:
        """Admit ``obj`` and keep it under a new resourceVersion; with ``dry_run``, answer with what would be
        kept (at the resourceVersion held now) and keep nothing."""
        if self.admit is not None:
            obj = self.admit(obj)
        obj = without_nulls(obj)
        meta = obj["metadata"]
        meta["name"] = ref.name
        if ref.namespace:
            meta["namespace"] = ref.namespace
        for k in ("labels", "annotations", "finalizers"):
            if k in meta and not meta[k]:
                del meta[k]
        if dry_run:
            meta["resourceVersion"] = self._objects[self._key(ref)]["metadata"]["resourceVersion"]
            return copy.deepcopy(obj)
        meta["resourceVersion"] = self._next_version()
        key = self._key(ref)
        self._changed_to("MODIFIED" if key in self._objects else "ADDED", key, obj)
        self._objects[key] = obj
        return copy.deepcopy(obj)

    # --- lists and watches ------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        ref: Ref,
        *,
        body: Any = None,
        query: dict[str, str] | None = None,
        content_type: str | None = None,
    ) -> Obj:
        """A GET as :class:`~greyrelease.kube.client.KubeClient` sends it: an object, or a collection as the
        API server lists it (``items`` and the list's ``metadata.resourceVersion``), with the query's
        ``labelSelector`` and ``fieldSelector``. Other methods go through :meth:`create`, :meth:`patch`,
        :meth:`replace` and :meth:`delete`."""
        if method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"MemoryKube.request serves GET only, not {method} {ref}")
        if ref.name is not None:
            found = self.get(ref)
            if found is None:
                raise NotFound(404, "NotFound", f'{ref.resource} "{ref.name}" not found')
            return found
        query = query or {}
        self._serve("LIST", ref)
        limit = int(query.get("limit") or 0)
        after: list[str] | None = None
        version: int | str
        if query.get("continue"):
            version, after = json.loads(base64.b64decode(query["continue"]))
        with self._lock:
            self._keep_changes()
            listed = [
                (k, o)
                for k, o in sorted(self._objects.items())
                if self._within(k, ref) and self._matches(o, query) and (after is None or list(k) > after)
            ]
            if after is None:
                version = self._current_version()
            chunk = listed[:limit] if limit > 0 else listed
            items = [copy.deepcopy(o) for _, o in chunk]
        meta: dict[str, Any] = {"resourceVersion": str(version)}
        if len(chunk) < len(listed):
            # Unlike the API server, later pages hold the objects as they are now, not at the first page's
            # version: a change made between the pages shows in them at its newer resourceVersion.
            meta["continue"] = base64.b64encode(json.dumps([str(version), list(chunk[-1][0])]).encode()).decode()
            meta["remainingItemCount"] = len(listed) - len(chunk)
        return {"kind": "List", "apiVersion": "v1", "metadata": meta, "items": items}

    def watch(
        self,
        ref: Ref,
        *,
        resource_version: str | None,
        timeout_seconds: int = 290,
        query: dict[str, str] | None = None,
    ) -> Iterator[Obj]:
        """The changes to the collection ``ref`` after ``resource_version`` (from now when None), as events
        (``{"type": "ADDED" | "MODIFIED" | "DELETED", "object": ...}``), as they are made, until
        ``timeout_seconds`` pass or :meth:`end_watches` is called. A version older than the changes kept
        gets one ``ERROR`` event with code 410, as the API server answers a watch that is too old."""
        self._serve("WATCH", ref)
        query = query or {}
        deadline = time.monotonic() + timeout_seconds
        with self._lock:
            self._keep_changes()
            epoch = self._watch_epoch
            since = int(resource_version) if resource_version else self._current_version()
        while True:
            with self._lock:
                if since + 1 < self._kept_since:  # changes after `since` were dropped: too old
                    yield {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
                    return
                due = [c for c in self._changes or () if c[0] > since]
                if not due:
                    left = deadline - time.monotonic()
                    if left <= 0 or epoch != self._watch_epoch:
                        return
                    self._changed.wait(min(left, 1.0))
                    if epoch != self._watch_epoch:
                        return
                    continue
            for version, kind, key, obj in due:
                since = version
                if self._within(key, ref) and self._matches(obj, query):
                    yield {"type": kind, "object": copy.deepcopy(obj)}

    def end_watches(self) -> None:
        """End every open watch (they return as when the server closes them)."""
        with self._lock:
            self._watch_epoch += 1
            self._changed.notify_all()

    def _keep_changes(self) -> None:
        if self._changes is None:
            self._changes = deque(maxlen=self.KEPT_CHANGES)
            self._kept_since = self._current_version() + 1

    def _current_version(self) -> int:
        """The version of the last write."""
        return self._version

    def _next_version(self) -> str:
        """A new version, for a write."""
        self._version += 1
        return str(self._version)

    def _changed_to(self, kind: str, key: Key, obj: Obj) -> None:
        """Keep a change for watches (once a list or a watch asked for them) and wake them."""
        if self._changes is None:
            return
        version = int(obj["metadata"]["resourceVersion"])
        if len(self._changes) == self._changes.maxlen:
            self._kept_since = self._changes[1][0] if len(self._changes) > 1 else version
        self._changes.append((version, kind, key, copy.deepcopy(obj)))
        self._changed.notify_all()

    @staticmethod
    def _matches(obj: Obj, query: dict[str, str]) -> bool:
        """Whether ``obj`` is selected by the query's ``labelSelector`` and ``fieldSelector``."""
        if not selects(query.get("labelSelector"), (obj.get("metadata") or {}).get("labels") or {}):
            return False
        for term in (query.get("fieldSelector") or "").split(","):
            term = term.strip()
            if not term:
                continue
            negated = "!=" in term
            field, want = term.split("!=" if negated else "=", 1)
            value: Any = obj
            for part in field.strip().lstrip("=").split("."):
                value = value.get(part) if isinstance(value, dict) else None
            have = "" if value is None else str(value)
            if (have == want.lstrip("=").strip()) == negated:
                return False
        return True
