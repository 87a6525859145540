"""The controller's process: kopf's wiring (:mod:`.operator`), the state kept while running
(:class:`Runtime`: which release to wake on which event, the pass pool), leader election, shards, the
garbage collector's settings, /healthz and /readyz, and the memory profiler."""

from greyrelease.runtime.controller import Runtime, Shard, Tuning

__all__ = ["Runtime", "Shard", "Tuning"]
