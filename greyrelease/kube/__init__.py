"""The Kubernetes API seam: the :class:`Kube` protocol every adapter writes through, on references to API
objects (:class:`Ref`, built by :func:`path`), the client that speaks it to an API server (:mod:`.client`)
and the one retry policy of its calls (:mod:`.retry`), an in-memory API server for tests
(:class:`MemoryKube`, in :mod:`.memory`), the watch-fed cache that answers reads (:mod:`.cache`), and what
the controller knows of Deployments' shapes (:mod:`.workload`)."""

from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import JSON_PATCH, MERGE, ApiError, Conflict, Kube, NotFound, Ref, path

__all__ = ["JSON_PATCH", "MERGE", "ApiError", "Conflict", "Kube", "MemoryKube", "NotFound", "Ref", "path"]
