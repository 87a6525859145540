"""The runtime's per-release series: on the process's /metrics while it drives the release, gone when the
release is deleted, and gone when the runtime stops (a shard handed over or lost, the lease lost)."""

from __future__ import annotations

from greyrelease.runtime.controller import Runtime
from prometheus_client import REGISTRY

from tests.support.builders import NS, RELEASE, T0, cluster


def exported_of_web() -> int:
    """The samples of release shop/web the process's /metrics would serve (every runtime's)."""
    return sum(
        1
        for family in REGISTRY.collect()
        for s in family.samples
        if s.name.startswith("greyrelease_release_") and (s.labels["namespace"], s.labels["name"]) == (NS, "web")
    )


def test_a_deleted_release_takes_its_series_with_it() -> None:
    kube = cluster()
    rt = Runtime(kube)
    before = exported_of_web()
    rt.reconciler.reconcile(NS, "web", now=T0)
    assert [key for key, _ in rt.series.exported()] == [(NS, "web")]
    assert exported_of_web() == before + len(rt.series.exported()[0][1])

    body = kube.get(RELEASE)
    assert body is not None
    kube.delete(RELEASE)
    rt.release_changed(body, "DELETED")
    assert rt.series.exported() == []
    assert exported_of_web() == before


def test_a_runtime_that_stops_exports_nothing_more() -> None:
    rt = Runtime(cluster())
    rt.reconciler.reconcile(NS, "web", now=T0)
    mine = len(rt.series.exported()[0][1])
    with_it = exported_of_web()
    rt.stop()
    assert exported_of_web() == with_it - mine
    rt.reconciler.reconcile(NS, "web", now=T0)  # a pass still running when the shard was given up
    assert rt.series.exported() == []
    assert exported_of_web() == with_it - mine
