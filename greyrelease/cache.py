"""Reads served from memory: the objects a reconcile pass reads on every pass, kept current by watches.

A pass reads its GreyRelease and the target and canary Deployments. Reading them from the API server on
every pass made each release cost two dozen GETs per rollout and queued hundreds of aborts behind each
other's reads. Here they come from a local copy instead:

- :class:`Store` keeps the latest known body of each object. Watch events and the responses to the
  controller's own writes are folded in, and the newer ``resourceVersion`` wins, so a pass never plans
  from a view older than the controller's last write of that object (its own status patch, say), and a
  late watch event never rolls a newer write back.
- :class:`Reflector` keeps a Store in step with one collection: a list, then a watch from the list's
  resourceVersion (with bookmarks), listing again when the watch is too old (410 Gone). A relist
  replaces the copy, so an object deleted while no watch was open does not linger.
- :class:`CachingClient` is a :class:`~greyrelease.kubeclient.KubeClient` that answers GETs of a cached
  collection from its Store (falling back to the API server for what it does not hold) and folds the
  response of every create and patch into it.

Everything a pass decides is still made idempotent by the pass itself; the cache only makes the reads
cheap. A watch delivers a change a few milliseconds after it is written; whatever woke the release for
that change (the same watch, or kopf's watch of GreyReleases, which folds its body in first) arrives
after the change is in the Store.
"""

from __future__ import annotations

import copy
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from .kubeclient import ApiError, KubeClient, MERGE

Obj = dict[str, Any]
Key = tuple[str, str]
log = logging.getLogger("greyrelease")

#: Waits between failed lists or watches of a Reflector.
RETRY_DELAYS = (0.5, 1.0, 2.0, 5.0)
#: How long a watch request stays open before the server ends it (it is reopened at once).
WATCH_SECONDS = 290

_PATH = re.compile(r"^(?P<api>/api/v1|/apis/[^/]+/[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)/(?P<name>[^/]+)(?:/[^/]+)?$")


def _version(obj: Obj) -> int | None:
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return None


def _newer(candidate: int | None, held: int | None) -> bool:
    """Whether a body at ``candidate`` replaces one at ``held``. resourceVersions are compared as numbers
    (what every API server backed by etcd gives); where either is not a number, the later arrival wins."""
    return candidate is None or held is None or candidate >= held


def _trim(obj: Obj) -> Obj:
    """The body as kept: without managedFields, which no pass reads and which are most of its size."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


def _key(obj: Obj) -> Key | None:
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    return (meta.get("namespace") or "", name) if name else None


class Store:
    """The latest known body of each object of one kind; thread-safe. Bodies handed out are copies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[Key, Obj] = {}
        self._gone: dict[Key, int | None] = {}  # resourceVersion of each deletion seen (until the next relist)

    def get(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            found = self._objects.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    def fold(self, obj: Obj) -> bool:
        """Keep ``obj`` (an event's object or a write's response) unless a newer body or deletion is known.
        True when kept."""
        key = _key(obj)
        if key is None:
            return False
        version = _version(obj)
        with self._lock:
            held = self._objects.get(key)
            if held is not None and not _newer(version, _version(held)):
                return False
            if held is None and key in self._gone and not _newer(version, self._gone[key]):
                return False  # a write's response that arrived after the deletion it preceded
            self._gone.pop(key, None)
            self._objects[key] = _trim(obj)
            return True

    def delete(self, obj: Obj) -> None:
        key = _key(obj)
        if key is None:
            return
        version = _version(obj)
        with self._lock:
            held = self._objects.get(key)
            if held is not None and not _newer(version, _version(held)):
                return  # deleted and created again since; the newer body stays
            self._objects.pop(key, None)
            self._gone[key] = version

    def replace(self, items: Iterable[Obj], version: int | None) -> None:
        """A fresh list at ``version``: its items replace the copy. What the controller wrote after the
        list was served (a newer resourceVersion) is kept."""
        fresh = {k: _trim(o) for o in items if (k := _key(o)) is not None}
        with self._lock:
            for key, held in self._objects.items():
                if key not in fresh and version is not None and (_version(held) or 0) > version:
                    fresh[key] = held
            for key, held in list(fresh.items()):
                if key in self._gone and version is not None and (self._gone[key] or 0) > version:
                    del fresh[key]
            self._objects = fresh
            self._gone = {k: v for k, v in self._gone.items() if version is None or (v or 0) > version}


class Reflector:
    """Keeps a :class:`Store` in step with one collection (list + watch) on a thread of its own.

    ``on_change(event_type, obj)`` is called on that thread after each watch event is in the Store (not
    for the objects of a list).
    """

    def __init__(
        self,
        kube: KubeClient,
        collection: str,
        store: Store | None = None,
        on_change: Callable[[str, Obj], None] | None = None,
    ) -> None:
        self.kube = kube
        self.collection = collection
        self.store = store if store is not None else Store()
        self.on_change = on_change
        self.synced = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"reflector {collection}", daemon=True)

    def start(self) -> Reflector:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()

    def _run(self) -> None:
        failures = 0
        version: str | None = None
        while not self._stopping.is_set():
            try:
                if version is None:
                    listed = self.kube.request("GET", self.collection)
                    version = str((listed.get("metadata") or {}).get("resourceVersion") or "") or None
                    self.store.replace(listed.get("items") or [], int(version) if version and version.isdigit() else None)
                    self.synced.set()
                version = self._watch(version)
                failures = 0
            except Exception as err:  # noqa: BLE001 - the API server may be away; list again after a wait
                delay = RETRY_DELAYS[min(failures, len(RETRY_DELAYS) - 1)]
                failures += 1
                if isinstance(err, ApiError) and err.status == 410:
                    version = None
                log.debug(f"watch of {self.collection} failed ({err}); again in {delay:g}s")
                self._stopping.wait(delay)

    def _watch(self, version: str | None) -> str | None:
        """Follow the collection from ``version`` until the server ends the watch; the version to go on
        from, or None when the watch is too old and the collection must be listed again."""
        for event in self.kube.watch(self.collection, resource_version=version, timeout_seconds=WATCH_SECONDS):
            if self._stopping.is_set():
                return version
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    return None
                raise ApiError(int(obj.get("code") or 500), str(obj.get("reason", "")), str(obj.get("message", "")))
            version = (obj.get("metadata") or {}).get("resourceVersion") or version
            if kind == "BOOKMARK":
                continue
            if kind == "DELETED":
                self.store.delete(obj)
            else:
                self.store.fold(obj)
            if self.on_change is not None:
                try:
                    self.on_change(kind, obj)
                except Exception:  # noqa: BLE001 - a listener's failure must not stop the watch
                    log.exception(f"listener of {self.collection} failed")
        return version


class CachingClient(KubeClient):
    """A KubeClient whose GETs of cached collections are answered from memory.

    A GET of an object the Store does not hold (not yet listed, or not there) goes to the API server, and
    its answer is kept. Creates and patches go to the API server and their responses are folded in.
    """

    def __init__(self, cfg: Any, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self._stores: dict[tuple[str, str], tuple[Store, Callable[[], bool] | None]] = {}
        self.hits = 0
        self.misses = 0

    def cache(self, api: str, plural: str, store: Store, *, ready: Callable[[], bool] | None = None) -> None:
        """Serve ``api``/``plural`` (e.g. ``/apis/apps/v1``, ``deployments``) from ``store``; with
        ``ready``, only while it says so (e.g. once the first list is in)."""
        self._stores[(api, plural)] = (store, ready)

    def _store_for(self, p: str) -> tuple[Store, Callable[[], bool] | None, str, str] | None:
        m = _PATH.match(p.split("?", 1)[0])
        if m is None or (held := self._stores.get((m["api"], m["plural"]))) is None:
            return None
        return held[0], held[1], m["ns"], m["name"]

    def get(self, path: str) -> Obj | None:
        found = self._store_for(path)
        if found is not None and not path.rstrip("/").endswith(("/status", "/scale")):
            store, ready, namespace, name = found
            if ready is None or ready():
                obj = store.get(namespace, name)
                if obj is not None:
                    self.hits += 1
                    return obj
            self.misses += 1
        obj = super().get(path)
        if obj is not None and found is not None:
            found[0].fold(obj)
        return obj

    def create(self, path: str, body: Obj) -> Obj:
        out = super().create(path, body)
        self._fold(path + "/" + str((out.get("metadata") or {}).get("name", "")), out)
        return out

    def patch(self, path: str, body: Any, *, patch_type: str = MERGE) -> Obj:
        out = super().patch(path, body, patch_type=patch_type)
        self._fold(path, out)
        return out

    def _deleted(self, path: str, response: Obj | None) -> None:
        found = self._store_for(path)
        if found is None:
            return
        store, _, namespace, name = found
        meta = (response or {}).get("metadata") or {}
        if response is not None and response.get("kind") != "Status" and meta.get("deletionTimestamp"):
            store.fold(response)  # held by finalizers (e.g. a foreground deletion): still there, marked
        else:
            # Gone: no pass should see it until the watch (or a create of ours) says otherwise.
            store.delete({"metadata": {"namespace": namespace, "name": name, "resourceVersion": meta.get("resourceVersion")}})

    def _fold(self, path: str, obj: Obj) -> None:
        found = self._store_for(path)
        if found is not None and obj.get("metadata"):
            found[0].fold(obj)


def wait_synced(reflectors: Iterable[Reflector], timeout: float) -> bool:
    """Wait until every reflector has its first list in (or ``timeout`` passes); True when all have."""
    deadline = time.monotonic() + timeout
    return all(r.synced.wait(max(0.0, deadline - time.monotonic())) for r in reflectors)
