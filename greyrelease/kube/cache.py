"""Reads served from memory: the objects a reconcile pass reads on every pass, kept current by watches.

A pass reads its GreyRelease, the target and canary Deployments, and (in the routers) Services. Reading
them from the API server on every pass made each release cost two dozen GETs per rollout and queued
hundreds of aborts behind each other's reads. Here they come from a local copy instead:

- :class:`Store` keeps the latest known body of each object. Watch events (kopf's watch of
  GreyReleases, see :mod:`greyrelease.runtime.operator`, and the reflectors below for Deployments and Services)
  and the responses to the controller's own writes are folded in, and the newer ``resourceVersion``
  wins, so a pass never plans from a view older than the controller's last write of that object (its
  own status patch, say), and a late watch event never rolls a newer write back.
- :class:`Reflector` keeps a Store in step with one collection: a list, then a watch from the list's
  resourceVersion (with bookmarks), listing again when the watch is too old (410 Gone). A relist
  replaces the copy, so an object deleted while no watch was open does not linger.
- :class:`CachedKube` wraps a :class:`~greyrelease.kube.protocol.Kube`: GETs of a cached collection are answered
  from its Store (falling back to the API server for what it does not hold), and the response of every
  write is folded in. A write answered 404 drops the object: it is gone, whatever the Store last heard.

Everything a pass decides is still made idempotent by the pass itself; the cache only makes the reads
cheap. A watch delivers a change a few milliseconds after it is written; whatever woke the release for
that change (the same watch, or the GreyReleases' watch, which folds the body in first) arrives after
the change is in the Store.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, cast

import orjson
from tenacity import RetryCallState, Retrying, retry_if_exception_type
from tenacity.wait import wait_base

from greyrelease.api.release import Obj
from greyrelease.kube.protocol import MERGE, ApiError, Kube, NotFound, PatchBody, Ref, selects
from greyrelease.kube.retry import Backoff, checked

Key = tuple[str, str]
log = logging.getLogger("greyrelease")


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


Body = Obj | bytes  # a body as held: the dict itself, or (packed) its JSON


def _copy(body: Body) -> Obj:
    """A copy of a body held, for a pass to read and change: parsed from its JSON when packed, else a
    deep copy made through JSON too (orjson's round trip of a Deployment takes 7 us against 42 us for
    copy.deepcopy; the bodies are JSON, so nothing else is lost)."""
    return cast(Obj, orjson.loads(body if isinstance(body, bytes) else orjson.dumps(body)))


def _pack(obj: Obj) -> bytes:
    """The body's JSON, in a bytes object of its own size (orjson hands out a larger buffer: 4 KiB held for
    a 1.6 KB Deployment)."""
    return bytes(memoryview(orjson.dumps(obj)))


class Store:
    """The latest known body of each object of one kind; thread-safe. Bodies handed out are copies.

    A ``packed`` store holds each body as its JSON rather than as dicts: a Deployment as the API server
    serves it is 1.6 KB of JSON against 9.2 KiB of Python dicts and strings, and parsing it for a pass is
    faster than copying the dicts was (6 us against 42 us). The Deployments and Services are held packed;
    the GreyReleases are not, as kopf keeps each one's latest body too and the store shares that dict."""

    def __init__(self, *, packed: bool = False) -> None:
        self._lock = threading.Lock()
        self._packed = packed
        self._objects: dict[Key, tuple[int | None, Body]] = {}  # resourceVersion and body of each object
        self._gone: dict[Key, int | None] = {}  # resourceVersion of each deletion seen (until the next relist)
        #: Bumped by every change of what is held (a body kept, a deletion, a relist): equal counts, the same
        #: objects at the same versions.
        self.changes = 0

    def _hold(self, obj: Obj) -> tuple[int | None, Body]:
        kept = _trim(obj)
        return _version(obj), _pack(kept) if self._packed else kept

    def get(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            found = self._objects.get((namespace, name))
        return _copy(found[1]) if found is not None else None

    def version(self, namespace: str, name: str) -> str | None:
        """The resourceVersion of the body held, as the API server wrote it; None when none is held (or its
        version was not a number). Nothing is parsed."""
        with self._lock:
            found = self._objects.get((namespace, name))
        return str(found[0]) if found is not None and found[0] is not None else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    def values(self, namespace: str | None = None) -> list[Obj]:
        """Copies of the bodies held (of one namespace, when given), in key order."""
        with self._lock:
            found = [o for k, (_, o) in sorted(self._objects.items()) if namespace is None or k[0] == namespace]
        return [_copy(o) for o in found]

    def first(self, match: Callable[[Obj], bool], *, containing: bytes = b"") -> Obj | None:
        """A copy of the first body held, in key order, that ``match`` accepts; None when none does. In a
        packed store, only the bodies whose JSON contains ``containing`` are parsed and tried."""
        with self._lock:
            found = [o for _, (_, o) in sorted(self._objects.items())]
        for body in found:
            if isinstance(body, bytes) and containing not in body:
                continue
            obj = _copy(body)
            if match(obj):
                return obj
        return None

    def fold(self, obj: Obj) -> bool:
        """Keep ``obj`` (an event's object or a write's response) unless a newer body or deletion is known.
        True when kept."""
        key = _key(obj)
        if key is None:
            return False
        version = _version(obj)
        held = self._hold(obj)  # (packed outside the lock)
        with self._lock:
            found = self._objects.get(key)
            if found is not None and not _newer(version, found[0]):
                return False
            if found is None and key in self._gone and not _newer(version, self._gone[key]):
                return False  # a write's response that arrived after the deletion it preceded
            self._gone.pop(key, None)
            self._objects[key] = held
            self.changes += 1
            return True

    def delete(self, obj: Obj) -> None:
        key = _key(obj)
        if key is None:
            return
        version = _version(obj)
        with self._lock:
            found = self._objects.get(key)
            if found is not None and not _newer(version, found[0]):
                return  # deleted and created again since; the newer body stays
            self._objects.pop(key, None)
            self._gone[key] = version
            self.changes += 1

    def absent(self, namespace: str, name: str) -> bool:
        """Known not to exist: deleted (a watch event or our own delete) or answered 404, and not seen since."""
        key = (namespace, name)
        with self._lock:
            return key not in self._objects and key in self._gone

    def mark_absent(self, namespace: str, name: str) -> None:
        """The API server answered 404 for the object: remember it as absent, unless a body has been folded
        meanwhile (a watch event newer than the answer)."""
        key = (namespace, name)
        with self._lock:
            if key not in self._objects:
                self._gone.setdefault(key, None)

    def forget(self, namespace: str, name: str) -> None:
        """Drop the object, whatever its version (a write to it was answered 404)."""
        self.delete({"metadata": {"namespace": namespace, "name": name}})

    def replace(self, items: Iterable[Obj], version: int | None) -> None:
        """A fresh list at ``version``: its items replace the copy. What the controller wrote after the
        list was served (a newer resourceVersion) is kept."""
        fresh = {k: self._hold(o) for o in items if (k := _key(o)) is not None}
        with self._lock:
            for key, held in self._objects.items():
                if key not in fresh and version is not None and (held[0] or 0) > version:
                    fresh[key] = held
            for key in list(fresh):
                if key in self._gone and version is not None and (self._gone[key] or 0) > version:
                    del fresh[key]
            self._objects = fresh
            self._gone = {k: v for k, v in self._gone.items() if version is None or (v or 0) > version}
            self.changes += 1


#: Objects a page of a Reflector's list holds (client-go's reflectors list 500 at a time too).
LIST_PAGE = 500
#: How long a watch request stays open before the server ends it (it is reopened at once).
WATCH_SECONDS = 290
#: Waits before a Reflector lists or watches again after a failure (0.5, 1, 2, 4, then 5 s, each with up to
#: 0.25 s of jitter, so that the reflectors of every namespace do not come back to a restarted API server
#: in step; or the Retry-After of a 429): the API calls' backoff (:class:`~greyrelease.kube.retry.Backoff`)
#: with a longer start and cap, as this loop never gives up. Each list, and each watch's opening, has been
#: retried by the API calls' policy (:data:`~greyrelease.kube.retry.API`) before it counts as failed here.
WATCH_RETRY_WAIT: wait_base = Backoff(first=0.5, jitter=0.25, cap=5.0)


class NotHeld(Exception):
    """A write refused before it was sent: the shard it belongs to is no longer held by this replica."""


class Watchable(Protocol):
    """What a Reflector needs of the API client: a plain request (the list) and a streaming watch, both
    with extra query parameters (e.g. a ``shardSelector``)."""

    def request(self, method: str, ref: Ref, *, query: dict[str, str] | None = None) -> Obj: ...

    def watch(
        self, ref: Ref, *, resource_version: str | None, timeout_seconds: int, query: dict[str, str] | None = None
    ) -> Iterator[Obj]: ...


class Reflector:
    """Keeps a :class:`Store` in step with one collection (list + watch) on a thread of its own.

    ``on_change(event_type, obj)`` is called on that thread after each watch event is in the Store (not
    for the objects of a list), and ``on_relist()`` after every list but the first: a watch too old to
    resume (410 Gone, after an outage) is followed by a list, and whatever changed in between came with no
    event.

    Why a reflector of our own and not kopf's watches (``kopf.on.event``), which feed the GreyReleases'
    store: measured with the benchmark, Deployments and Services fed through kopf instead of these
    reflectors cost abort latency, transition lag, CPU and memory (bench/README.md, "Reflectors rather
    than kopf's watches"). kopf handles every event of every Deployment
    on the event loop (a worker per object, its batching window, a Body and a logger per event): the
    loop that also takes the abort annotations in and queues the passes. A reflector folds each event on
    its own thread and hands the loop only the wake-ups. A relist (after 410 Gone) also drops what was
    deleted while no watch was open, which kopf's relist does not report.
    """

    def __init__(
        self,
        kube: Watchable,
        collection: Ref,
        store: Store | None = None,
        on_change: Callable[[str, Obj], None] | None = None,
        query: dict[str, str] | None = None,
        on_relist: Callable[[], None] | None = None,
    ) -> None:
        self.kube = kube
        self.collection = collection
        self.query = query or None
        self.store = store if store is not None else Store()
        self.on_change = on_change
        self.on_relist = on_relist
        self.synced = threading.Event()
        self._version: str | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"reflector {collection}", daemon=True)

    def start(self) -> Reflector:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()

    def _run(self) -> None:
        def failed(state: RetryCallState) -> None:
            err = state.outcome.exception() if state.outcome else None
            if isinstance(err, ApiError) and err.status == 410:
                self._version = None  # too old: list again
            seconds = state.next_action.sleep if state.next_action else 0
            log.debug(f"watch of {self.collection} failed ({err}); again in {seconds:g}s")

        while not self._stopping.is_set():
            # The API server may be away: list or watch again after a wait, from where the last watch got.
            retrying = Retrying(
                wait=WATCH_RETRY_WAIT,
                retry=retry_if_exception_type(Exception),
                before_sleep=failed,
                stop=lambda _: self._stopping.is_set(),
                sleep=self._pause,
                reraise=True,
            )
            try:
                retrying(self._follow)
            except Exception:  # stopped while failing
                return

    def _pause(self, seconds: float) -> None:
        """A wait between attempts that a stop ends at once."""
        self._stopping.wait(seconds)

    def _follow(self) -> None:
        """List when there is no version to go on from, then watch until the server ends the watch."""
        if self._version is None:
            again = self.synced.is_set()
            self._version = self._list()
            self.synced.set()
            if again and self.on_relist is not None:
                try:
                    self.on_relist()
                except Exception:  # a listener's failure must not stop the watch
                    log.exception(f"listener of {self.collection} failed")
        self._version = self._watch(self._version)

    def _list(self) -> str | None:
        """The collection listed into the Store; the list's resourceVersion. In a function of its own so
        that the parsed list is freed before the watch, which may last 290 s (bench/README.md, "The lists freed
        before the watch").

        Listed in pages of :data:`LIST_PAGE` objects, as client-go's reflectors list: the API server serves
        every page from the first one's snapshot (its resourceVersion), and each page is packed into the
        Store before the next is read, so at most one page is held parsed. One list of everything held all
        of it parsed at once, 10,000 Deployments at a controller's start, and the allocator kept the peak
        (bench/README.md, "Lists in pages"). A continue token that expired meanwhile (410) fails the list,
        which is tried again from the first page."""
        query = {**(self.query or {}), "limit": str(LIST_PAGE)}
        try:
            page = self.kube.request("GET", self.collection, query=query)
        except NotFound:
            # The kind is not served (its CRD is not installed): there is none of it. Listed again after
            # the retry's wait, so a CRD installed later is seen.
            self.store.replace([], None)
            self.synced.set()
            raise
        version = str((page.get("metadata") or {}).get("resourceVersion") or "") or None

        def items() -> Iterator[Obj]:
            nonlocal page
            while True:
                yield from page.get("items") or []
                token = (page.get("metadata") or {}).get("continue")
                if not token:
                    return
                page = {}  # the page read is let go before the next one is parsed
                page = self.kube.request("GET", self.collection, query={**query, "continue": token})

        self.store.replace(items(), int(version) if version and version.isdigit() else None)
        return version

    def _watch(self, version: str | None) -> str | None:
        """Follow the collection from ``version`` until the server ends the watch; the version to go on
        from, or None when the watch is too old and the collection must be listed again."""
        for event in self.kube.watch(
            self.collection, resource_version=version, timeout_seconds=WATCH_SECONDS, query=self.query
        ):
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
                    self.on_change(str(kind), obj)
                except Exception:  # a listener's failure must not stop the watch
                    log.exception(f"listener of {self.collection} failed")
        return version


def wait_synced(reflectors: Iterable[Reflector], timeout: float) -> bool:
    """Wait until every reflector has its first list in (or ``timeout`` passes); True when all have."""
    deadline = time.monotonic() + timeout
    return all(r.synced.wait(max(0.0, deadline - time.monotonic())) for r in reflectors)


def uncached(kube: Kube) -> Kube:
    """The API server behind ``kube``: reads that must not be answered from memory go there."""
    return kube.inner if isinstance(kube, CachedKube) else kube


class CachedKube:
    """A :class:`~greyrelease.kube.protocol.Kube` whose GETs of cached collections are answered from memory.

    It wraps another Kube (the API server's client, or an in-memory one in tests). A GET of an object the
    Store does not hold goes through, and its answer is kept, a 404 as "absent": an object known to be
    gone (deleted, or not found) is answered None from memory until a watch event or a write of ours
    brings it back. Creates and patches go through and their responses are folded in; a DELETE's outcome
    is folded in too. A write answered 404 drops the object from memory: it is gone whatever the Store
    last heard. With ``writable`` (a replica's hold on its shard), every write asks it first and is
    refused with :class:`NotHeld` when it says no.
    """

    def __init__(self, inner: Kube, *, writable: Callable[[], bool] | None = None) -> None:
        self.inner = inner
        self.writable = writable
        self._stores: dict[tuple[str, str, str], tuple[Store, Callable[[], bool] | None]] = {}
        self._lists: set[tuple[str, str, str]] = set()
        self.hits = 0
        self.misses = 0

    def cache(self, kind: Ref, store: Store, *, ready: Callable[[], bool] | None = None, lists: bool = False) -> None:
        """Serve the objects of ``kind`` (e.g. ``path("apps", "v1", "deployments")``, in any namespace) from
        ``store``; with ``ready``, only while it says so (e.g. once the first list is in). With ``lists``,
        LISTs too (for collections whose store holds every object once ready: one fed by a list and a
        watch)."""
        self._stores[kind.gvr] = (store, ready)
        if lists:
            self._lists.add(kind.gvr)

    def _store_for(self, ref: Ref) -> Store | None:
        """The store of the object ``ref`` (or of its subresource), if its kind is cached."""
        if ref.name is None or (held := self._stores.get(ref.gvr)) is None:
            return None
        return held[0]

    def get(self, ref: Ref) -> Obj | None:
        store = self._store_for(ref)
        namespace, name = ref.namespace or "", ref.name or ""
        if store is not None and ref.subresource is None:
            ready = self._stores[ref.gvr][1]
            if ready is None or ready():
                obj = store.get(namespace, name)
                if obj is not None:
                    self.hits += 1
                    return obj
                if store.absent(namespace, name):
                    # Deleted, or asked for before and not found: a release reads its canary Deployment on
                    # every pass, also long after the promotion removed it (bench/README.md, "Absent
                    # objects remembered").
                    self.hits += 1
                    return None
            self.misses += 1
        obj = self.inner.get(ref)
        if store is not None:
            if obj is not None:
                store.fold(obj)
            elif ref.subresource is None:
                ready = self._stores[ref.gvr][1]
                if ready is None or ready():
                    store.mark_absent(namespace, name)
        return obj

    def list(self, ref: Ref, *, label_selector: str | None = None) -> list[Obj]:
        if ref.name is None and ref.gvr in self._lists:
            store, ready = self._stores[ref.gvr]
            if ready is None or ready():
                self.hits += 1
                found = store.values(ref.namespace or None)
                return [o for o in found if selects(label_selector, (o.get("metadata") or {}).get("labels") or {})]
        return self.inner.list(ref, label_selector=label_selector)

    def _writing(self, verb: str, ref: Ref) -> contextlib.AbstractContextManager[None]:
        """Refuse the write unless this replica may make it (:attr:`writable`), and again before each time
        the client sends it again (:func:`~greyrelease.kube.retry.checked`): a write first tried while the
        shard was held may be retried after its Lease could have passed to another replica."""
        writable = self.writable
        if writable is None:
            return contextlib.nullcontext()

        def check() -> None:
            if not writable():
                raise NotHeld(f"{verb} {ref} refused: this replica does not hold the shard any more")

        check()
        return checked(check)

    def create(self, ref: Ref, body: Obj) -> Obj:
        with self._writing("POST", ref):
            out = self.inner.create(ref, body)
        self._fold(ref.named(str((out.get("metadata") or {}).get("name", ""))), out)
        return out

    def patch(
        self,
        ref: Ref,
        body: PatchBody,
        *,
        patch_type: str = MERGE,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        if dry_run:
            # Nothing is stored: the answer is not folded in (no pass may see what was only tried), and a
            # replica may send it whatever it holds.
            return self.inner.patch(ref, body, patch_type=patch_type, field_manager=field_manager, dry_run=True)
        try:
            with self._writing("PATCH", ref):
                out = self.inner.patch(ref, body, patch_type=patch_type, field_manager=field_manager)
        except NotFound:
            self._gone(ref)
            raise
        self._fold(ref, out)
        return out

    def replace(self, ref: Ref, body: Obj) -> Obj:
        try:
            with self._writing("PUT", ref):
                out = self.inner.replace(ref, body)
        except NotFound:
            self._gone(ref)
            raise
        self._fold(ref, out)
        return out

    def delete(self, ref: Ref, *, propagation: str = "Background") -> Obj | None:
        with self._writing("DELETE", ref):
            answer = self.inner.delete(ref, propagation=propagation)
        store = self._store_for(ref)
        if store is None:
            return answer
        meta = (answer or {}).get("metadata") or {}
        if answer is not None and answer.get("kind") != "Status" and meta.get("deletionTimestamp"):
            store.fold(answer)  # held by finalizers (e.g. a foreground deletion): still there, marked
        else:
            # Gone: no pass should see it until the watch (or a create of ours) says otherwise; a watch
            # event older than the deletion does not bring it back.
            version = meta.get("resourceVersion")
            store.delete({"metadata": {"namespace": ref.namespace or "", "name": ref.name, "resourceVersion": version}})
        return answer

    def _gone(self, ref: Ref) -> None:
        """No pass should see the object until the watch (or a create of ours) says otherwise."""
        store = self._store_for(ref)
        if store is not None:
            store.forget(ref.namespace or "", ref.name or "")

    def _fold(self, ref: Ref, obj: Obj) -> None:
        store = self._store_for(ref)
        if store is not None and obj.get("metadata"):
            store.fold(obj)
