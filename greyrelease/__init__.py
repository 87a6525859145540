"""GreyRelease: progressive canary and batch releases for Kubernetes Deployments.

The packages are layers, each importing only those below it (checked by ``lint-imports``):
``cli`` > ``runtime`` > ``reconcile`` > ``routers`` > ``kube`` > ``planner`` > ``admission`` > ``analysis``
> ``api``. The bottom four are pure. A release's next step is decided by :func:`greyrelease.planner.decide`
from its spec, its recorded status and what the cluster looks like, with no I/O, so every transition can
be tested without a cluster and replayed after a crash; whether a Deployment's new pod template is held
at admission is decided by :mod:`greyrelease.admission` from the admission review alone (the webhook that
serves it is in ``runtime``).

What kopf does for us: the watch of GreyReleases, the finalizer and the deletion handler, the process's
startup, cleanup and signal handling. What we do ourselves, and why:

- one queue of passes for all the releases (:mod:`greyrelease.runtime.scheduler`): a release is a key and
  the time its next pass is due, sooner when a watch event wakes it; rather than kopf's retried handlers,
  which write their retry state to the object at every step and cannot be cut short by an abort, or a
  kopf daemon per release, a task for the release's whole life even at rest;
- reflectors of our own for Deployments and Services (:mod:`greyrelease.kube.cache`): one watch per
  namespace, the bodies held as JSON, the responses to our writes folded in, so a pass reads memory;
- Events named after the transition they belong to (:mod:`greyrelease.reconcile.record`), so a pass
  repeated after a crash posts none twice;
- a pool of pass threads where what a person asked for goes first (:mod:`greyrelease.runtime.pool`).
"""

__version__ = "0.1.0"
