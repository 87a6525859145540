"""What the planner asks the adapters to do: plain data, applied in order by the reconciler.

Every action is idempotent ("make it so"): applying one twice, or after a crash, changes nothing more.

An action carries everything its adapter needs to carry it out: an adapter reads nothing of the plan's
status (nor of the status it was built from). What is only needed to carry an action out, in some modes,
rather than asked by it (the stable ReplicaSet's hash a Service is narrowed to) is left out of the
comparison of two actions: ``SetWeight(0)`` is the abort, whichever ReplicaSet is the stable one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from greyrelease.api.release import GreyReleaseStatus


@dataclass(frozen=True)
class EnsureCanary:
    """The canary Deployment exists with ``replicas`` replicas, built (pinned mode) from the stable template
    with ``image``, or (follow mode, ``template`` set) from the Deployment's ``spec.template`` as written:
    the held template whose digest is ``template``. When the Deployment holds another template by then,
    nothing is built: the next pass plans again from what it holds."""

    replicas: int
    image: str = ""
    version: str = ""
    template: str = ""


@dataclass(frozen=True)
class ScaleStable:
    """The stable Deployment has ``replicas`` replicas."""

    replicas: int


@dataclass(frozen=True)
class SetStableImage:
    """The stable Deployment runs ``image`` on ``replicas`` replicas (promotion, or restoring it)."""

    image: str
    replicas: int


@dataclass(frozen=True)
class DeleteCanary:
    """The canary Deployment is deleted in the foreground, so it disappears only after its pods."""


@dataclass(frozen=True)
class PrepareRouting:
    """The routing objects exist with the canary at weight 0 (canary Service/Ingress), and the stable
    Service, where the mode has one of its own (nginx, Gateway API), selects only the pods of the stable
    ReplicaSet: those labelled ``pod-template-hash: <stable_hash>``."""

    stable_hash: str = field(default="", compare=False)


@dataclass(frozen=True)
class SetWeight:
    """The canary gets ``weight`` percent of the traffic (0 = none: this is the abort). In Service mode
    weight 0 narrows the Service to the pods of the stable ReplicaSet, ``stable_hash``."""

    weight: int
    header_match: dict[str, str] | None = None
    stable_hash: str = field(default="", compare=False)


@dataclass(frozen=True)
class RestoreStableSelector:
    """The stable Service selects on the user's labels again (before the stable Deployment rolls)."""


@dataclass(frozen=True)
class ResetRouting:
    """Everything the router added is gone and the user's objects are as they were."""


@dataclass(frozen=True)
class RemoveAnnotations:
    """The GreyRelease no longer carries these annotations (consumed one-shot requests)."""

    keys: tuple[str, ...]


@dataclass(frozen=True)
class Enrol:
    """Follow mode: the target Deployment carries the label ``greyrelease.io/release: <release>``, so the
    admission webhook holds its new pod templates."""

    release: str


@dataclass(frozen=True)
class Unenrol:
    """Follow mode: the target Deployment no longer carries ``greyrelease.io/release: <release>`` (a label
    with another value is not ours and is left)."""

    release: str


@dataclass(frozen=True)
class ReleaseHold:
    """Follow mode: the target Deployment's hold of template ``digest`` is lifted (``spec.paused`` and
    ``greyrelease.io/held`` removed, in one JSON patch under the field manager ``greyrelease``, which the
    webhook lets through); the Deployment controller rolls the template itself. Nothing is done when the
    Deployment holds no template or another one (the patch's ``test`` refuses that too)."""

    digest: str


@dataclass(frozen=True)
class TakeSlot:
    """This release holds a slot of the queue whose slots the Lease ``lease`` (namespace/name) keeps, of
    which there are ``limit``. Taken with a write the API server arbitrates: when the slots are all held
    by then, the write is refused and nothing after it in the plan is applied."""

    lease: str
    limit: int
    scope: str
    since: datetime  # recorded with the holder
    stale: tuple[str, ...] = ()  # holders (uids) known to be done: dropped in the same write


@dataclass(frozen=True)
class FreeSlot:
    """This release holds no slot of the queue kept by ``lease``."""

    lease: str


Action = (
    EnsureCanary
    | ScaleStable
    | SetStableImage
    | DeleteCanary
    | PrepareRouting
    | SetWeight
    | RestoreStableSelector
    | ResetRouting
    | RemoveAnnotations
    | Enrol
    | Unenrol
    | ReleaseHold
    | TakeSlot
    | FreeSlot
)

#: The actions that write the stable Deployment's spec.replicas or spec.template: never planned in follow
#: mode, where the only field of the Deployment the release writes is spec.paused (:class:`ReleaseHold`).
WRITES_STABLE_SPEC = (ScaleStable, SetStableImage)


@dataclass(frozen=True)
class Regarding:
    """The object an Event is about when it is not the release itself (follow mode: the target Deployment,
    told why it stays paused or that it was handed back). Named as the pass observed it: its uid ties the
    Event to that object, not to a later one of the same name."""

    name: str
    uid: str = ""
    kind: str = "Deployment"
    api_version: str = "apps/v1"


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str
    #: None: the release itself.
    about: Regarding | None = None


@dataclass(frozen=True)
class Plan:
    status: GreyReleaseStatus
    actions: tuple[Action, ...] = ()
    events: tuple[Event, ...] = ()
    #: Seconds until the release should be looked at again; None: only when something changes.
    requeue_after: float | None = None
    #: Whether ``requeue_after`` is (or includes) a poll: a look again in case a wake-up is lost while the
    #: release waits on what the watches wake it for (its Deployments converging), not a time the plan
    #: itself depends on. A pass that left nothing changed need not be repeated for it while nothing it
    #: read changes (see ``Runtime.unchanged``).
    polled: bool = False
    #: With ``polled``: the seconds until a time the plan depends on (a deadline), None when there is none.
    timer_after: float | None = None
    #: Deletion only: everything is cleaned up and the finalizer may go.
    done: bool = False
