"""The dashboard's view of the cluster, kept current by watches of the API server with the user's credentials.

Three collections are listed and then watched (:class:`~greyrelease.kube.cache.Reflector`, the controller's
own list-and-watch loop, which lists again when a watch is too old and waits and retries when the API
server is away): the GreyReleases of the namespace (or of all), their Events (``fieldSelector
involvedObject.kind=GreyRelease``), and the GreyReleasePolicies (cluster-wide; a user who may not read
them sees the release's own windows only, and the page says why). Nothing is polled: each change the API
server sends is folded into the :class:`~greyrelease.cli.dashboard.views.History` and calls ``on_change``,
which wakes the pages' event streams. A list or watch the API server refuses is kept as that feed's
error (its reason and message), shown on the page until one succeeds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from greyrelease.api.release import GROUP, PLURAL, VERSION, Obj
from greyrelease.cli.dashboard.views import History
from greyrelease.cli.plugin import Api
from greyrelease.kube.cache import CachedKube, Reflector, Watchable
from greyrelease.kube.protocol import ApiError, NotFound, Ref, path
from greyrelease.planner.governance import Rules
from greyrelease.reconcile.policies import POLICIES_PATH, governing, read_policies, rules_of

#: The Events of GreyReleases only (the API server selects them; a busy namespace has many others).
EVENTS_QUERY = {"fieldSelector": "involvedObject.kind=GreyRelease"}


def _reason(err: Exception) -> str:
    if isinstance(err, ApiError):
        return f"{err.reason or err.status}: {err.message}"
    return f"{type(err).__name__}: {err}"


class Reporting:
    """The API as one Reflector uses it, keeping the last failure of a list or a watch (cleared when the
    next one succeeds) and calling ``on_change`` when that changes."""

    def __init__(self, api: Watchable, on_change: Callable[[], None], *, absent_is_empty: bool = False) -> None:
        self.api = api
        self.on_change = on_change
        self.absent_is_empty = absent_is_empty
        self.error = ""

    def _set(self, error: str) -> None:
        if error != self.error:
            self.error = error
            self.on_change()

    def request(self, method: str, ref: Ref, *, query: dict[str, str] | None = None) -> Obj:
        try:
            out = self.api.request(method, ref, query=query)
        except NotFound as err:
            # The kind is not served. For the policies that is no policy at all; for the releases, a CRD
            # not installed: said on the page.
            self._set("" if self.absent_is_empty else _reason(err))
            raise
        except Exception as err:
            self._set(_reason(err))
            raise
        self._set("")
        return out

    def watch(
        self, ref: Ref, *, resource_version: str | None, timeout_seconds: int, query: dict[str, str] | None = None
    ) -> Iterator[Obj]:
        try:
            for event in self.api.watch(
                ref, resource_version=resource_version, timeout_seconds=timeout_seconds, query=query
            ):
                obj = event.get("object") or {}
                if event.get("type") != "ERROR":
                    self._set("")  # the watch is open again
                elif obj.get("code") != 410:
                    self._set(f"{obj.get('reason') or obj.get('code')}: {obj.get('message') or ''}")
                yield event
        except Exception as err:
            self._set(_reason(err))
            raise


class _Reflector(Reflector):
    """A Reflector that also says when a list has come in (a first list, or one after a watch too old)."""

    def __init__(
        self,
        api: Watchable,
        collection: Ref,
        listed: Callable[[list[Obj]], None],
        on_change: Callable[[str, Obj], None],
        query: dict[str, str] | None = None,
    ) -> None:
        super().__init__(api, collection, on_change=on_change, query=query)
        self._listed = listed

    def _list(self) -> str | None:
        version = super()._list()
        self._listed(self.store.values())
        return version


class Feed:
    """The releases, their Events and the policies of one namespace (``None``: all), from list and watch."""

    def __init__(
        self,
        api: Api,
        namespace: str | None,
        on_change: Callable[[], None],
        *,
        history: History | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.namespace = namespace
        self.history = history if history is not None else History()
        self._on_change = on_change
        self._clock = clock
        self.sources = {
            "releases": Reporting(api, on_change),
            "events": Reporting(api, on_change),
            "policies": Reporting(api, on_change, absent_is_empty=True),
        }
        self.releases = _Reflector(
            self.sources["releases"],
            path(GROUP, VERSION, PLURAL, namespace),
            self._releases_listed,
            on_change=self._release_changed,
        )
        self.events = _Reflector(
            self.sources["events"],
            path("", "v1", "events", namespace),
            lambda _: on_change(),
            on_change=lambda _kind, _obj: on_change(),
            query=EVENTS_QUERY,
        )
        self.policies = _Reflector(
            self.sources["policies"], POLICIES_PATH, lambda _: on_change(), on_change=lambda _kind, _obj: on_change()
        )
        # The policies are read as the controller reads them (read_policies), from the watched copy.
        self._policies = CachedKube(api)
        self._policies.cache(POLICIES_PATH, self.policies.store, ready=self.policies.synced.is_set, lists=True)
        self._reflectors = (self.releases, self.events, self.policies)
        self._started = threading.Event()

    def start(self) -> Feed:
        if not self._started.is_set():
            self._started.set()
            for r in self._reflectors:
                r.start()
        return self

    def stop(self) -> None:
        for r in self._reflectors:
            r.stop()

    def wait_synced(self, timeout: float) -> bool:
        """Whether the releases and their Events have been listed within ``timeout`` seconds."""
        return self.releases.synced.wait(timeout) and self.events.synced.wait(timeout)

    def _releases_listed(self, items: list[Obj]) -> None:
        now = self._clock()
        for obj in items:
            self.history.observe(obj, now)
        self._on_change()

    def _release_changed(self, kind: str, obj: Obj) -> None:
        if kind == "DELETED":
            self.history.forget(obj)
        else:
            self.history.observe(obj, self._clock())
        self._on_change()

    # --- reads, from memory ----------------------------------------------------------------------------

    def release(self, namespace: str, name: str) -> Obj | None:
        return self.releases.store.get(namespace, name)

    def all_releases(self) -> list[Obj]:
        return self.releases.store.values()

    def events_of(self, namespace: str) -> list[Obj]:
        return self.events.store.values(namespace)

    def rules(self, release: Obj) -> tuple[Rules, str]:
        """The windows and freezes of the policies that govern ``release``, and, when they could not be
        read, why (the page then says the release's own windows are all it shows)."""
        error = self.sources["policies"].error
        if not self.policies.synced.is_set():
            return Rules(), f"the GreyReleasePolicies could not be read ({error})" if error else ""
        rules = rules_of(governing(read_policies(self._policies), release))
        return rules, f"the GreyReleasePolicies may be out of date ({error})" if error else ""

    def errors(self) -> dict[str, str]:
        """Each feed's last failure, for the page (empty when none)."""
        return {name: source.error for name, source in self.sources.items() if source.error}
