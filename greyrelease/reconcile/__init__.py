"""One pass over one release, with I/O: observe the cluster, :func:`~greyrelease.planner.decide`, carry the
plan's actions out, post its Events, record its status (:class:`Reconciler`); the metric gates'
queries, the governing policies and the concurrency slots it reads."""

from greyrelease.reconcile.reconciler import Outcome, Reconciler

__all__ = ["Outcome", "Reconciler"]
