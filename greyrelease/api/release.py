"""The GreyRelease API (``greyrelease.io/v1``): the one source of truth for the CRD and the controller.

The CRD in ``crds/`` is generated from these models by :mod:`greyrelease.api.crd`; the controller parses every
object it reads with them. Validation that the API server can do (types, ranges, patterns, CEL rules) is
declared here so a bad object is refused at ``kubectl apply`` with a message that names the field; what
needs the cluster (how many replicas the target has) is checked by the planner, which marks the release
``InvalidSpec`` without touching a workload.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

#: A Kubernetes object as JSON (what the API server sends and takes).
Obj = dict[str, Any]

GROUP = "greyrelease.io"
VERSION = "v1"
KIND = "GreyRelease"
PLURAL = "greyreleases"
SINGULAR = "greyrelease"
SHORT_NAMES = ["gr"]

#: Annotations users write. They live under our own prefix: kopf hides annotations under its own.
ANNOTATION_PREFIX = "greyrelease.io/"
ABORT_ANNOTATION = ANNOTATION_PREFIX + "abort"
PAUSE_ANNOTATION = ANNOTATION_PREFIX + "pause"
PROMOTE_ANNOTATION = ANNOTATION_PREFIX + "promote"
RETRY_ANNOTATION = ANNOTATION_PREFIX + "retry"

#: The label that puts releases of several namespaces into one queue (see GreyReleasePolicy.concurrency).
GROUP_LABEL = "greyrelease.io/group"

#: Labels the controller puts on the canary pods (never on the stable ones: that would roll them).
TRACK_LABEL = "greyrelease.io/track"
VERSION_LABEL = "greyrelease.io/version"
RELEASE_LABEL = "greyrelease.io/release"
#: The label the Deployment controller gives every pod of a ReplicaSet; narrowing a Service selector to
#: the stable ReplicaSet's value cuts the canary off without restarting a pod.
POD_TEMPLATE_HASH_LABEL = "pod-template-hash"

MAX_BATCHES = 50
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
PERCENT_PATTERN = r"^(100|[1-9][0-9]?)%$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
# A Kubernetes object name (DNS-1123 subdomain) and an image reference without spaces.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
VERSION_PATTERN = r"^[A-Za-z0-9._:/@+-]+$"


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration such as ``90s``, ``1m30s`` or ``250ms``.

    >>> parse_duration("1m30s")
    90.0
    """
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"{text!r} is not a duration such as 30s, 5m or 1h30m")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(text))


def _cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    out: JsonDict = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


class _Model(BaseModel):
    # populate_by_name: the models are built from camelCase JSON and from Python alike.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


class _Camel(_Model):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, alias_generator=_camel)


def _with_rules(*rules: JsonDict) -> ConfigDict:
    """The configuration of a model (as :class:`_Camel`) whose object carries CEL rules in the CRD."""
    return ConfigDict(
        extra="forbid",
        populate_by_name=True,
        frozen=True,
        alias_generator=_camel,
        json_schema_extra={"x-kubernetes-validations": list(rules)},
    )


Duration = Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32)]
Replicas = Annotated[
    int | Annotated[str, Field(pattern=PERCENT_PATTERN, max_length=4)],
    Field(
        description='Canary replicas: a count (2) or a share of the stable replicas ("20%").',
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    f"type(self) == int ? self >= 1 : self.matches('{PERCENT_PATTERN}')",
                    'replicas must be a count of at least 1 or a percentage from "1%" to "100%"',
                )
            ]
        },
    ),
]


class TargetRef(_Camel):
    kind: Literal["Deployment"] = Field("Deployment", description="Only Deployment is supported.")
    name: str = Field(min_length=1, max_length=253, pattern=NAME_PATTERN, description="The stable Deployment.")


class Approval(_Camel):
    """How long a batch with ``pause: manual`` waits for its approval, and what happens then."""

    timeout: Duration = Field(description="How long the approval is waited for, from when the batch went live.")
    on_timeout: Literal["abort", "promote"] = Field(
        "abort", description="When nobody approved in time: abort (roll back) or promote (go on to the next batch)."
    )


PAUSE_TEXT = Annotated[str, Field(pattern=DURATION_PATTERN + "|^manual$", max_length=32)]


class Batch(_Camel):
    model_config = _with_rules(
        _cel(
            "!has(self.approval) || has(self.pause) && self.pause == 'manual'",
            "approval goes with pause: manual",
            ".approval",
        )
    )
    replicas: Replicas
    weight: int | None = Field(
        None,
        ge=0,
        le=100,
        description="Percent of traffic to the canary in this batch (router modes). Defaults to the replica share.",
    )
    pause: PAUSE_TEXT | None = Field(
        None,
        description='How long to hold the batch before moving on ("30s"), or "manual" to wait '
        "for greyrelease.io/promote. Absent: move on as soon as the batch is ready.",
    )
    approval: Approval | None = Field(
        None, description="With pause: manual: how long the approval is waited for, and what happens then."
    )
    header_match: dict[str, str] | None = Field(
        None,
        description="Router modes: send requests with these headers to the canary whatever the weight.",
    )

    @field_validator("replicas")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be at least 1")
        return v

    @model_validator(mode="after")
    def _approval_with_manual(self) -> Batch:
        if self.approval is not None and self.pause != "manual":
            raise ValueError("approval goes with pause: manual")
        return self


class ServiceRouting(_Camel):
    name: str = Field(
        min_length=1, max_length=63, pattern=NAME_PATTERN, description="The Service that selects both tracks."
    )


class NginxRouting(_Camel):
    ingress: str = Field(
        min_length=1,
        max_length=246,
        pattern=NAME_PATTERN,
        description="The user's Ingress (copied to <ingress>-canary).",
    )
    stable_service: str = Field(
        min_length=1, max_length=56, pattern=NAME_PATTERN, description="The Service the Ingress routes to."
    )
    annotation_prefix: str = Field(
        "nginx.ingress.kubernetes.io", min_length=1, max_length=200, description="The ingress-nginx annotation prefix."
    )


class GatewayRouting(_Camel):
    http_route: str = Field(
        min_length=1, max_length=253, pattern=NAME_PATTERN, description="The user's HTTPRoute (weights set on it)."
    )
    stable_service: str = Field(
        min_length=1, max_length=56, pattern=NAME_PATTERN, description="The backend Service of the stable track."
    )


class TrafficRouting(_Camel):
    model_config = _with_rules(
        _cel(
            "[has(self.service), has(self.nginx), has(self.gatewayAPI)].filter(x, x).size() == 1",
            "exactly one of service, nginx or gatewayAPI must be set",
        )
    )
    service: ServiceRouting | None = Field(None, description="Traffic follows the replica ratio of one Service.")
    nginx: NginxRouting | None = Field(None, description="Weights on an ingress-nginx canary Ingress.")
    gateway_api: GatewayRouting | None = Field(
        None, alias="gatewayAPI", description="Weights on the backendRefs of a Gateway API HTTPRoute."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> TrafficRouting:
        if sum(x is not None for x in (self.service, self.nginx, self.gateway_api)) != 1:
            raise ValueError("exactly one of service, nginx or gatewayAPI must be set")
        return self


class ThresholdRange(_Camel):
    min: float | None = Field(None, description="Fail below this.")
    max: float | None = Field(None, description="Fail above this.")


class Compare(_Camel):
    max_increase: float = Field(ge=0, description="Fail when canary > stable * (1 + maxIncrease).")
    floor: float = Field(0.0, ge=0, description="Stable values below this count as this (avoids 0 * anything).")


class Metric(_Camel):
    name: str = Field(
        min_length=1, max_length=63, pattern=r"^[A-Za-z0-9_.-]+$", description="Shown in status and Events."
    )
    query: str = Field(
        min_length=1,
        max_length=4096,
        description="PromQL. Placeholders: {{namespace}}, {{name}}, {{track}}, {{version}}, {{batch}}, {{app}}.",
    )
    threshold_range: ThresholdRange | None = Field(None, description="Absolute bounds of a passing value.")
    compare: Compare | None = Field(None, description="Judge the canary against the stable track.")
    on_no_data: Literal["fail", "pass", "wait"] = Field(
        "wait", description="The verdict of a check that finds no data."
    )
    failure_limit: int = Field(0, ge=0, le=100, description="Failed checks tolerated in a batch.")
    consecutive_error_limit: int = Field(4, ge=1, le=100, description="Query errors in a row that fail the release.")
    successes_required: int = Field(1, ge=1, le=100, description="Passing checks a batch needs to move on.")


class SecretKeyRef(_Camel):
    name: str = Field(
        min_length=1, max_length=253, pattern=NAME_PATTERN, description="A Secret in the release's namespace."
    )
    key: str = Field(min_length=1, max_length=253, description="The key holding the token.")


class Prometheus(_Camel):
    address: str = Field(
        min_length=1, max_length=2048, pattern=r"^https?://[^\s]+$", description="Prometheus' base URL."
    )
    bearer_token_secret: SecretKeyRef | None = Field(None, description="Send this token as a Bearer token.")
    timeout: Duration = Field("5s", description="Per query; failures are retried briefly, then counted as errors.")
    insecure_skip_verify: bool = Field(False, description="Do not verify Prometheus' TLS certificate.")


#: Where in a release a webhook is called (see Webhook checks in the README).
WEBHOOK_POINTS = ("pre-traffic", "live", "pre-promotion", "post-rollback")
#: The longest a webhook call may take: a pass waits for its calls, and an abort of the same release waits
#: for the pass.
WEBHOOK_TIMEOUT_MAX = 30.0
FIELD_PATH_PATTERN = r"^[A-Za-z0-9_$@-]+(\.[A-Za-z0-9_$@-]+)*$"


class SecretRef(_Camel):
    name: str = Field(
        min_length=1, max_length=253, pattern=NAME_PATTERN, description="A Secret in the release's namespace."
    )


class AnswerCondition(_Camel):
    """What a 2xx answer's JSON must hold for the check to pass: one field, equal to a value or within
    bounds."""

    model_config = _with_rules(
        _cel(
            "has(self.equals) != (has(self.min) || has(self.max))",
            "a condition has equals, or min and/or max",
        )
    )
    field: str = Field(
        min_length=1,
        max_length=256,
        pattern=FIELD_PATH_PATTERN,
        description="A path into the JSON answer: keys joined by dots, a number for a list's item (result.ok, "
        "checks.0.passed).",
    )
    equals: str | None = Field(
        None,
        max_length=256,
        description='Pass when the field equals this: "true" for true, "42" for 42 (as a number), text for text.',
    )
    min: float | None = Field(None, description="Pass when the field is a number at least this.")
    max: float | None = Field(None, description="Pass when the field is a number at most this.")

    @model_validator(mode="after")
    def _one_form(self) -> AnswerCondition:
        if (self.equals is not None) == (self.min is not None or self.max is not None):
            raise ValueError("a condition has equals, or min and/or max")
        return self


class Webhook(_Camel):
    """An HTTP call at a point of the release whose answer gates it (see Webhook checks in the README)."""

    model_config = _with_rules(
        _cel(
            "!has(self.approval) || has(self.kind) && self.kind == 'confirm'",
            "approval goes with kind: confirm",
            ".approval",
        ),
        _cel(
            "!(self.at == 'post-rollback' && has(self.kind) && self.kind == 'confirm')",
            "a post-rollback webhook is informative: it cannot be a confirm",
            ".kind",
        ),
        _cel(
            "!has(self.timeout) || duration(self.timeout) <= duration('30s')",
            "timeout must be at most 30s",
            ".timeout",
        ),
    )
    name: str = Field(
        min_length=1, max_length=63, pattern=r"^[A-Za-z0-9_.-]+$", description="Shown in status and Events."
    )
    at: Literal["pre-traffic", "live", "pre-promotion", "post-rollback"] = Field(
        description="pre-traffic: each batch's canary is ready, before it gets traffic. live: while a batch has "
        "its traffic, every analysis interval. pre-promotion: after the last batch passed, before the stable is "
        "promoted. post-rollback: once a rollback is done (informative: its answer changes nothing)."
    )
    kind: Literal["check", "confirm"] = Field(
        "check",
        description="check: the answer passes or fails the batch, as a metric's check does. confirm: the batch "
        "waits (not failed) until the answer is yes.",
    )
    url: str = Field(
        min_length=1,
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
        description="Called with the release's state as JSON. Placeholders: {{namespace}}, {{name}}, {{app}}, "
        "{{track}}, {{version}}, {{batch}}.",
    )
    method: Literal["POST", "GET"] = Field("POST", description="POST sends the release's state; GET sends no body.")
    timeout: Duration = Field("5s", description="Per call, at most 30s; no answer by then is an error.")
    bearer_token_secret: SecretKeyRef | None = Field(None, description="Send this token as a Bearer token.")
    headers_secret: SecretRef | None = Field(
        None, description="Send every key of this Secret as a header of that name (an API key, a signature)."
    )
    condition: AnswerCondition | None = Field(
        None, description="Judge the JSON answer too: a 2xx answer passes only when it meets this."
    )
    approval: Approval | None = Field(
        None, description="kind: confirm: how long the yes is waited for, and what happens then (abort or promote)."
    )
    failure_limit: int = Field(0, ge=0, le=100, description="kind: check: failed answers tolerated in a batch.")
    consecutive_error_limit: int = Field(
        4, ge=1, le=100, description="Errors in a row (no answer, 5xx, not the JSON asked for) that fail the release."
    )
    successes_required: int = Field(
        1, ge=1, le=100, description="kind: check: passing answers a batch needs to move on."
    )

    @field_validator("timeout")
    @classmethod
    def _bounded(cls, v: str) -> str:
        if parse_duration(v) > WEBHOOK_TIMEOUT_MAX:
            raise ValueError("timeout must be at most 30s")
        return v

    @model_validator(mode="after")
    def _forms(self) -> Webhook:
        if self.approval is not None and self.kind != "confirm":
            raise ValueError("approval goes with kind: confirm")
        if self.at == "post-rollback" and self.kind == "confirm":
            raise ValueError("a post-rollback webhook is informative: it cannot be a confirm")
        return self


#: Why pre-traffic webhooks need a router that sets weights: in Service mode (and without trafficRouting) a
#: canary pod serves as soon as it is ready, so nothing would come before its traffic.
PRE_TRAFFIC_NEEDS_WEIGHTS = (
    "pre-traffic webhooks need trafficRouting nginx or gatewayAPI (in Service mode, or without trafficRouting, "
    "the canary's pods serve as soon as they are ready)"
)


class Analysis(_Camel):
    model_config = _with_rules(
        _cel(
            "has(self.metrics) && size(self.metrics) > 0 || has(self.webhooks) && size(self.webhooks) > 0",
            "analysis needs metrics or webhooks",
            ".metrics",
        ),
        _cel(
            "!has(self.metrics) || size(self.metrics) == 0 || has(self.prometheus)",
            "metrics need prometheus",
            ".prometheus",
        ),
    )
    prometheus: Prometheus | None = Field(None, description="Where the metrics are (required with metrics).")
    interval: Duration = Field(
        "10s", description="One check of every metric (and live webhook) per interval while a batch is live."
    )
    metrics: list[Metric] = Field(
        default_factory=list, max_length=20, description="All must pass for a batch to move on."
    )
    webhooks: list[Webhook] = Field(
        default_factory=list,
        max_length=20,
        description="HTTP checks at points of the release (see Webhook checks).",
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel("self.all(x, self.exists_one(y, y.name == x.name))", "webhook names must be unique")
            ]
        },
    )

    @model_validator(mode="after")
    def _gated(self) -> Analysis:
        if not self.metrics and not self.webhooks:
            raise ValueError("analysis needs metrics or webhooks")
        if self.metrics and self.prometheus is None:
            raise ValueError("metrics need prometheus")
        names = [w.name for w in self.webhooks]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"webhook names must be unique: {', '.join(twice)} more than once")
        return self

    def webhooks_at(self, point: str) -> list[Webhook]:
        """The webhooks called at ``point`` (one of :data:`WEBHOOK_POINTS`), in spec order."""
        return [w for w in self.webhooks if w.at == point]


# --- notifications: who hears of a release's Events ---------------------------------------------------

#: What a notification is sent for when its ``on`` is left out: every Warning Event, a batch waiting for
#: its approval, an approval that expired, and a release that succeeded (the Event reasons of
#: ``greyrelease.planner.reasons``, by name: this package imports nothing above it).
NOTIFY_DEFAULT_ON = ("Warning", "WaitingForApproval", "ApprovalExpired", "Succeeded")
#: The Event types an ``on`` entry may name instead of a reason: every Event of that type.
EVENT_TYPES = ("Normal", "Warning")


class UrlSecretRef(_Camel):
    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=NAME_PATTERN,
        description="The Secret: in the release's namespace for a release's notification, in the controller's "
        "namespace for a GreyReleasePolicy's.",
    )
    key: str = Field(
        min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$", description="The key holding the webhook URL."
    )


class Notification(_Camel):
    """Where a release's Events are sent, and which: one HTTP POST per Event it is on."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Names the notification in the status, its Events and the controller's metrics.",
    )
    format: Literal["generic", "slack"] = Field(
        "generic",
        description="generic: a JSON document of the Event and the release's state. slack: a Slack incoming-"
        "webhook message (Mattermost and Rocket.Chat take it too, Discord at its webhook URL + /slack).",
    )
    url_secret_ref: UrlSecretRef = Field(
        description="The Secret key holding the URL posted to (a webhook URL is a credential)."
    )
    on: list[Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Z][A-Za-z]*$")]] = Field(
        default_factory=lambda: list(NOTIFY_DEFAULT_ON),
        min_length=1,
        max_length=50,
        description="The Event reasons sent (listed under Notifications), or an Event type (Warning, Normal) "
        "for every Event of that type. Default: every Warning, WaitingForApproval, ApprovalExpired and Succeeded.",
        json_schema_extra={"default": list(NOTIFY_DEFAULT_ON)},
    )

    def wants(self, type: str, reason: str) -> bool:
        """Whether an Event of this type and reason is sent to this notification."""
        return reason in self.on or type in self.on


def _unique_names(items: list[Notification] | None) -> list[Notification] | None:
    names = [n.name for n in items or ()]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"notification names must be unique: {', '.join(twice)} more than once")
    return items


Notifications = Annotated[
    list[Notification] | None,
    Field(
        max_length=20,
        description="Where this release's Events are sent (see Notifications).",
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel("self.all(x, self.exists_one(y, y.name == x.name))", "notification names must be unique")
            ]
        },
    ),
]

# --- governance: when batches may start, and after what -------------------------------------------

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_DAY = "(" + "|".join(DAYS) + ")"
DAY_PATTERN = f"^{_DAY}(-{_DAY})?$"
CLOCK_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"


def days_of(spec: str) -> list[int]:
    """The weekdays (Monday = 0) a day name or range names; a range may wrap (``Fri-Mon``).

    >>> days_of("Mon-Wed"), days_of("Sat-Mon")
    ([0, 1, 2], [5, 6, 0])
    """
    first, _, last = spec.partition("-")
    a, b = DAYS.index(first), DAYS.index(last or first)
    return [(a + i) % 7 for i in range((b - a) % 7 + 1)]


class Window(_Camel):
    """When batches may start: on these days, from start to end, local time in timeZone. An end before the
    start crosses midnight: the window opens on a listed day and closes on the day after."""

    model_config = _with_rules(
        _cel(
            "self.start != self.end",
            "end must differ from start (an end before the start crosses midnight)",
            ".end",
        )
    )
    days: list[Annotated[str, Field(pattern=DAY_PATTERN, max_length=7)]] = Field(
        min_length=1, max_length=7, description='Day names or ranges: ["Mon-Fri", "Sun"].'
    )
    start: str = Field(pattern=CLOCK_PATTERN, max_length=5, description='Opens at (24-hour clock, "09:00").')
    end: str = Field(pattern=CLOCK_PATTERN, max_length=5, description='Closes at ("17:00"; "02:00" crosses midnight).')
    time_zone: str = Field(
        "UTC", min_length=1, max_length=64, description="An IANA time zone (Europe/Berlin); the clock is local."
    )

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {v!r} (use an IANA name such as Europe/Berlin)") from None
        return v

    @model_validator(mode="after")
    def _not_empty(self) -> Window:
        if self.start == self.end:
            raise ValueError("end must differ from start (an end before the start crosses midnight)")
        return self

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.time_zone)

    @property
    def weekdays(self) -> frozenset[int]:
        return frozenset(d for spec in self.days for d in days_of(spec))


class Freeze(_Camel):
    """A period in which no batch starts (a holiday, an incident)."""

    model_config = _with_rules(_cel("self.to > self.from", "to must be after from", ".to"))
    from_: AwareDatetime = Field(alias="from", description="Starts (RFC 3339, with a zone: 2026-12-20T00:00:00Z).")
    to: AwareDatetime = Field(description="Ends (RFC 3339).")
    reason: str = Field("", max_length=256, description="Shown while a release waits for it.")

    @model_validator(mode="after")
    def _ordered(self) -> Freeze:
        if self.to <= self.from_:
            raise ValueError("to must be after from")
        return self


class After(_Camel):
    name: str = Field(
        min_length=1, max_length=253, pattern=NAME_PATTERN, description="A GreyRelease in the same namespace."
    )


class LabelSelector(_Camel):
    """A Kubernetes label selector (``matchLabels`` and ``matchExpressions``)."""

    match_labels: dict[str, str] | None = Field(None, description="Labels that must all be equal.")
    match_expressions: list[LabelRequirement] | None = Field(None, description="Requirements that must all hold.")

    def matches(self, labels: dict[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in (self.match_labels or {}).items()):
            return False
        return all(r.matches(labels) for r in self.match_expressions or ())


class LabelRequirement(_Camel):
    key: str = Field(min_length=1, max_length=317)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] | None = None

    def matches(self, labels: dict[str, str]) -> bool:
        has, value, values = self.key in labels, labels.get(self.key), self.values or []
        match self.operator:
            case "In":
                return has and value in values
            case "NotIn":
                return not has or value not in values
            case "Exists":
                return has
            case _:
                return not has


LabelSelector.model_rebuild()


class Concurrency(_Camel):
    max_progressing: int = Field(ge=1, le=10000, description="At most this many releases progress at once.")
    per: Literal["Namespace", "Group"] = Field(
        "Namespace",
        description="Namespace: a queue per namespace. Group: one queue across the cluster per value of the "
        "release's greyrelease.io/group label (releases without the label are not limited by this policy).",
    )


class GreyReleasePolicySpec(_Camel):
    namespaces: list[Annotated[str, Field(max_length=63, pattern=NAME_PATTERN)]] | None = Field(
        None, max_length=1000, description="The namespaces whose releases it governs. Absent: every namespace."
    )
    selector: LabelSelector | None = Field(None, description="Only releases with these labels. Absent: all.")
    windows: list[Window] | None = Field(
        None, max_length=50, description="Batches start only within one of these windows."
    )
    freezes: list[Freeze] | None = Field(None, max_length=200, description="No batch starts within any of these.")
    concurrency: Concurrency | None = Field(None, description="A limit on releases progressing at once.")
    notifications: Notifications = Field(
        None,
        description="Where the Events of the releases it governs are sent (URLs in Secrets of the controller's "
        "namespace).",
    )

    _notification_names = field_validator("notifications")(_unique_names)

    def governs(self, namespace: str, labels: dict[str, str]) -> bool:
        if self.namespaces is not None and namespace not in self.namespaces:
            return False
        return self.selector is None or self.selector.matches(labels)


POLICY_KIND = "GreyReleasePolicy"
POLICY_PLURAL = "greyreleasepolicies"
POLICY_SINGULAR = "greyreleasepolicy"
POLICY_SHORT_NAMES = ["grp"]


class GreyReleasePolicy(_Camel):
    """A platform team's rules for the releases it picks (cluster-scoped: owned apart from the apps)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: GreyReleasePolicySpec = Field(default_factory=GreyReleasePolicySpec)


class GreyReleaseSpec(_Camel):
    model_config = _with_rules(
        _cel(
            "has(self.targetRef) != has(self.appName)",
            "exactly one of targetRef or appName must be set",
        ),
        _cel(
            "has(self.batches) != has(self.batchSize)",
            "exactly one of batches or batchSize (with canaryWeight) must be set",
        ),
        _cel(
            "has(self.batchSize) == has(self.canaryWeight)",
            "batchSize and canaryWeight go together",
        ),
        _cel(
            "!has(self.analysis) || !has(self.analysis.webhooks) || !self.analysis.webhooks.exists(w, w.at == "
            "'pre-traffic') || has(self.trafficRouting) && (has(self.trafficRouting.nginx) || "
            "has(self.trafficRouting.gatewayAPI))",
            PRE_TRAFFIC_NEEDS_WEIGHTS,
            ".analysis.webhooks",
        ),
    )
    target_ref: TargetRef | None = Field(None, description="The stable Deployment to release.")
    app_name: str | None = Field(
        None,
        min_length=1,
        max_length=63,
        pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="Shorthand for targetRef: the one Deployment labelled app=<appName>.",
    )
    container: str | None = Field(
        None,
        max_length=63,
        pattern=NAME_PATTERN,
        description="The container whose image is released (default: the first). Ignored in follow mode (no "
        "targetVersion): there the whole pod template is released as written.",
    )
    target_version: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        pattern=VERSION_PATTERN,
        description="Pinned mode: an image tag, or a full image reference when it contains ':' or '/'. Absent: "
        "follow mode, every new pod template of the Deployment (held at admission) is released.",
    )
    batches: list[Batch] | None = Field(
        None,
        description="The batches, in order; replicas and weights never decrease.",
        min_length=1,
        max_length=MAX_BATCHES,
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.filter(b, has(b.weight)).map(b, b.weight).isSorted()",
                    "batch weights must never decrease",
                ),
                _cel(
                    "!self.all(b, type(b.replicas) == int) || self.map(b, b.replicas).isSorted()",
                    "batch replicas must never decrease",
                ),
            ]
        },
    )
    batch_size: int | None = Field(None, ge=1, le=10000, description="Shorthand: canary replicas added per batch.")
    canary_weight: int | None = Field(None, ge=0, le=100, description="Shorthand: traffic percent added per batch.")
    pause: PAUSE_TEXT | None = Field(None, description="Shorthand: the pause of every batch but the last.")
    approval: Approval | None = Field(
        None,
        description="How long every batch with pause: manual waits for its approval (unless the batch says), and "
        "what happens then.",
    )
    traffic_routing: TrafficRouting | None = Field(
        None,
        description="How traffic reaches the canary. Absent: only replicas move, and an abort scales the canary away.",
    )
    analysis: Analysis | None = Field(None, description="Prometheus metrics and webhook checks that gate every batch.")
    progress_deadline_seconds: int = Field(
        600,
        ge=1,
        le=86400,
        description="A batch whose canary is not ready by then fails the release; so does a promotion not done by "
        "then (follow mode: only for a Deployment whose own progressDeadlineSeconds reports no timeout).",
    )
    paused: bool = Field(False, description="Hold at the current batch (like the greyrelease.io/pause annotation).")
    windows: list[Window] | None = Field(
        None, max_length=50, description="Batches start only within one of these windows (and those of policies)."
    )
    freezes: list[Freeze] | None = Field(
        None, max_length=200, description="No batch starts within any of these (nor within a policy's)."
    )
    after: list[After] | None = Field(
        None,
        max_length=50,
        description="Start only once these GreyReleases (same namespace) have Succeeded for their current spec.",
    )
    notifications: Notifications = Field(
        None,
        description="Where this release's Events are sent (URLs in Secrets of its namespace), besides those of "
        "the GreyReleasePolicies that govern it.",
    )

    _notification_names = field_validator("notifications")(_unique_names)

    @property
    def follows(self) -> bool:
        """Follow mode: no targetVersion, so every new pod template of the Deployment is a release of it."""
        return self.target_version is None

    @model_validator(mode="after")
    def _forms(self) -> GreyReleaseSpec:
        if (self.target_ref is None) == (self.app_name is None):
            raise ValueError("exactly one of targetRef or appName must be set")
        if (self.batches is None) == (self.batch_size is None):
            raise ValueError("exactly one of batches or batchSize (with canaryWeight) must be set")
        if (self.batch_size is None) != (self.canary_weight is None):
            raise ValueError("batchSize and canaryWeight go together")
        if self.batches:
            weights = [b.weight for b in self.batches if b.weight is not None]
            if weights != sorted(weights):
                raise ValueError("batches: weights must never decrease")
        if self.analysis is not None and self.analysis.webhooks_at("pre-traffic"):
            routing = self.traffic_routing
            if routing is None or (routing.nginx is None and routing.gateway_api is None):
                raise ValueError(f"analysis.webhooks: {PRE_TRAFFIC_NEEDS_WEIGHTS}")
        return self


class Phase(StrEnum):
    """Where a release is. The values are what the status stores (``kubectl get gr`` shows them)."""

    INITIALIZING = "Initializing"
    #: Holds before a batch starts: for a release window, the end of a freeze, or a predecessor.
    WAITING = "Waiting"
    #: Holds before batch 1 for a slot under a concurrency limit.
    QUEUED = "Queued"
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    PROMOTING = "Promoting"
    SUCCEEDED = "Succeeded"
    ROLLING_BACK = "RollingBack"
    ABORTED = "Aborted"
    FAILED = "Failed"
    INVALID_SPEC = "InvalidSpec"
    #: Follow mode at rest: enrolled, nothing held that differs from what runs, nothing released yet (or the
    #: last release reverted): the Deployment runs the template it has.
    IDLE = "Idle"


#: The phases a release rests in: none under way, nothing to do until the spec, an annotation or (in follow
#: mode) the Deployment's template changes.
TERMINAL_PHASES: frozenset[str] = frozenset(
    {Phase.SUCCEEDED, Phase.ABORTED, Phase.FAILED, Phase.INVALID_SPEC, Phase.IDLE}
)
#: What the message of a batch waiting for ``greyrelease.io/promote`` says.
WAITING_TEXT = "waiting for approval"
#: The phases in which a batch is under way, and so has a :class:`BatchState` (Waiting has one only
#: between batches: before batch 1 it has none).
BATCH_PHASES: frozenset[Phase] = frozenset({Phase.PROGRESSING, Phase.PAUSED, Phase.WAITING})


class BatchState(StrEnum):
    """Where the current batch is, while the release is Progressing (or Paused)."""

    #: The canary grows to the batch's size; the traffic is still that of the batch before.
    UPSCALING = "Upscaling"
    #: The canary is ready and has the batch's traffic; its pause and analysis run.
    VERIFYING = "Verifying"
    #: As Verifying, with ``pause: manual``: the batch waits for ``greyrelease.io/promote``.
    WAITING_FOR_APPROVAL = "WaitingForApproval"
    #: The batch passed (its pause, its gate, its approval); the next one waits to start (a release
    #: window, a freeze). The canary keeps the batch's size and traffic meanwhile.
    DONE = "Done"


#: The batch states each phase can have (None: no batch under way). Waiting has one only between batches.
STATES_OF: dict[Phase | None, tuple[BatchState | None, ...]] = {
    **{phase: (None,) for phase in [None, *Phase]},
    Phase.PROGRESSING: tuple(BatchState),
    Phase.PAUSED: tuple(BatchState),
    Phase.WAITING: (None, BatchState.DONE),
}


class Outcome(StrEnum):
    """How a release ended (``status.lastRelease.outcome``)."""

    SUCCEEDED = "Succeeded"
    #: Rolled back by the abort annotation, or by an approval that expired with onTimeout: abort.
    ABORTED = "Aborted"
    #: Rolled back by a failed gate, a missed deadline, the target or canary lost.
    FAILED = "Failed"
    #: Follow mode: the Deployment's template was put back to the one its pods run (a revert in Git).
    REVERTED = "Reverted"
    #: A newer version (pinned) or template (follow) replaced it before it ended.
    SUPERSEDED = "Superseded"


class CheckVerdict(StrEnum):
    """The verdict of one metric check (see :mod:`greyrelease.analysis.verdicts`)."""

    PASS = "Pass"
    FAIL = "Fail"
    NO_DATA = "NoData"
    ERROR = "Error"
    PENDING = "Pending"


def field_path(loc: tuple[int | str, ...], root: str = "spec") -> str:
    """A validation error's location as kubectl names fields: ``spec.windows[0].timeZone``."""
    out = root
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


_ZERO = timedelta(0)


def fmt_time(t: datetime) -> str:
    """RFC 3339 in UTC to the millisecond, as every timestamp of the status is stored:
    ``2026-01-01T12:00:00.000Z``."""
    # Called for every timestamp of the status each time it is serialised (bench/README.md, "The status
    # compared as pydantic serialises it"): a time already at offset zero (as read back: pydantic's own
    # zero-offset zone, not UTC) is not converted, and its "+00:00" is cut rather than searched for.
    if t.utcoffset() != _ZERO:
        t = t.astimezone(UTC)
    return t.isoformat(timespec="milliseconds")[:-6] + "Z"


def parse_time(text: str | None) -> datetime | None:
    """A timestamp as Kubernetes writes it (RFC 3339), None when absent or unreadable; UTC when it
    names no zone."""
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return _utc(parsed)


def _utc(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=UTC)


#: A point in time in the status: an aware datetime in Python, RFC 3339 (:func:`fmt_time`) in JSON.
Timestamp = Annotated[AwareDatetime, PlainSerializer(fmt_time, return_type=str, when_used="json")]


def _no_phase(value: Any) -> Any:
    return value or None


def _phase_text(value: Phase | None) -> str:
    return value.value if value is not None else ""


#: A phase or none, stored as its name or ``""`` (the stored form the field always had).
OptionalPhase = Annotated[
    Phase | None,
    BeforeValidator(_no_phase),
    PlainSerializer(_phase_text, return_type=str),
    WithJsonSchema({"type": "string"}),
]


class Condition(_Camel):
    type: str = Field(
        description="Ready (at rest, healthy), Reconciling (a release under way) and Stalled (stopped until "
        "someone acts: Aborted, Failed, InvalidSpec), as kstatus reads them; Progressing, Paused, Completed, "
        "Healthy and InvalidSpec."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="Whether the condition holds.")
    reason: str = Field("", description="The phase that set it.")
    message: str = Field("", description="The release's message while the condition holds.")
    last_transition_time: Timestamp | None = Field(None, description="When status last changed.")


class MetricStatus(_Camel):
    name: str = Field(description="The metric's name from spec.analysis.metrics.")
    value: float | None = Field(None, description="The canary's last value.")
    stable_value: float | None = Field(None, description="The stable track's last value (compare only).")
    verdict: CheckVerdict = Field(CheckVerdict.PENDING, description="Of the last check.")
    message: str = Field("", description="Why the last check had its verdict.")
    checked_at: Timestamp | None = Field(None, description="When the last check ran.")
    successes: int = Field(0, description="Passing checks in this batch.")
    failures: int = Field(0, description="Failed checks in this batch.")
    consecutive_errors: int = Field(0, description="Query errors in a row.")


class WebhookStatus(_Camel):
    """A webhook's last answer and its counts at the point it is called (see Webhook checks)."""

    name: str = Field(description="The webhook's name from spec.analysis.webhooks.")
    at: str = Field("", description="Where it is called: pre-traffic, live, pre-promotion or post-rollback.")
    kind: str = Field("check", description="check or confirm.")
    verdict: CheckVerdict = Field(
        CheckVerdict.PENDING, description="Of the last answer (a confirm's Fail is a no: it waits)."
    )
    code: int | None = Field(None, description="The HTTP status of the last answer; absent when none came.")
    value: str | None = Field(None, description="The condition's field in the last answer, as JSON.")
    message: str = Field("", description="Why the last answer had its verdict.")
    checked_at: Timestamp | None = Field(
        None, description="When it was last called in this batch (absent once a new batch begins)."
    )
    successes: int = Field(0, description="Passing answers (a confirm's yes) at this point of the batch.")
    failures: int = Field(0, description="Failed answers (a confirm's no) at this point of the batch.")
    consecutive_errors: int = Field(0, description="Errors in a row.")


class BatchRecord(_Camel):
    batch: int = Field(description="The batch number, from 1.")
    canary_replicas: int = Field(0, description="Canary replicas of the batch.")
    weight: int = Field(0, description="Traffic percent of the batch.")
    started_at: Timestamp | None = Field(None, description="When the batch began.")
    ready_at: Timestamp | None = Field(None, description="When the canary was ready and the weight set.")
    finished_at: Timestamp | None = Field(None, description="When the batch ended.")
    result: str = Field("", description="passed, promoted, or how it ended.")


class Restore(_Camel):
    """What the release changed on objects the user owns, to put back exactly."""

    replicas: int | None = Field(None, description="The stable's spec.replicas before the release.")
    image: str | None = Field(None, description="The stable container's image before the release.")
    template: str | None = Field(
        None,
        description="Follow mode: the digest of the template being released. Its canary and routing are "
        "removed at the end; nothing of the Deployment is put back (it is never written but spec.paused).",
    )


class ContainerImage(_Camel):
    name: str = Field(description="The container.")
    image: str = Field(description="Its image.")


class HeldTemplate(_Camel):
    """Follow mode: the pod template the Deployment holds (spec.paused and greyrelease.io/held)."""

    digest: str = Field(description="The template's digest (the value of greyrelease.io/held).")
    images: list[ContainerImage] = Field(default_factory=list, description="Its containers' images.")
    held_since: Timestamp | None = Field(None, description="When the controller first saw it held.")


class StableReplicaSet(_Camel):
    """Follow mode: the ReplicaSet of the Deployment's current revision, whose pods serve as the stable."""

    name: str = Field(description="The ReplicaSet.")
    revision: str = Field("", description="Its deployment.kubernetes.io/revision.")
    digest: str = Field("", description="Its pod template's digest (as greyrelease.io/held counts it).")
    images: list[ContainerImage] = Field(default_factory=list, description="Its containers' images.")


class LastRelease(_Camel):
    """The last release that ended, and how."""

    outcome: Outcome = Field(description="Succeeded, Aborted, Failed, Reverted or Superseded.")
    digest: str | None = Field(None, description="Follow mode: the digest of the template it released.")
    version: str | None = Field(None, description="Pinned mode: the targetVersion it released.")
    images: list[ContainerImage] = Field(default_factory=list, description="The images it released.")
    ended_at: Timestamp | None = Field(None, description="When it ended.")
    message: str = Field("", description="Why it ended so.")


class RequestRecord(_Camel):
    """Follow mode: the last value of one request annotation (``greyrelease.io/abort``, ``promote``,
    ``retry``) the controller saw, the release it is for, and what became of it. The annotation itself is
    never removed: a value recorded here is not acted on again (see Follow mode in the README)."""

    annotation: str = Field(
        description="The annotation: greyrelease.io/abort, greyrelease.io/promote or greyrelease.io/retry."
    )
    value: str = Field(description="Its value as seen. A different value is a new request.")
    template: str = Field(
        "",
        description="The release it is for: the digest of the template under way (or held) when the value was "
        "first seen; empty when none was.",
    )
    batch: int | None = Field(None, description="promote: the batch it approves (next as the batch it was seen at).")
    seen_at: Timestamp | None = Field(None, description="When the value was first seen.")
    done_at: Timestamp | None = Field(
        None, description="When it was honoured, or found not to apply; absent while it waits (promote: for its batch)."
    )
    result: str = Field("", description="What it did, or why it did nothing, in words.")


class ApprovalRecord(_Camel):
    """Follow mode: an approval the release under way was given (greyrelease.io/promote)."""

    batch: int = Field(description="The batch approved: it went on from there.")
    template: str = Field("", description="The digest of the template of the release it approved.")
    request: str = Field("", description="The annotation's value that approved it (2, next, full...).")
    at: Timestamp | None = Field(None, description="When it was honoured.")


class NotificationStatus(_Camel):
    """How the last notification of one entry of ``notifications`` (the release's or a policy's) went."""

    name: str = Field(description="The notification's name.")
    source: str = Field(description="Where it is declared: GreyRelease, or GreyReleasePolicy/<name>.")
    result: Literal["Sent", "Failed"] = Field(description="Sent (the receiver answered 2xx) or Failed.")
    message: str = Field("", description="Why it failed: the Secret, the answer, the error.")
    event: str = Field("", description="The Event (its reason and name) whose notification had this result.")
    at: Timestamp | None = Field(None, description="When.")


class BatchTimes(_Camel):
    """When the current batch began, went live and waits until. A batch that begins starts them afresh; one
    that ends (the promotion, the end of a rollback) keeps only when it began."""

    started_at: Timestamp | None = Field(None, description="When the batch began (its deadline counts from here).")
    ready_at: Timestamp | None = Field(None, description="When the batch went live (canary ready, weight set).")
    next_check_at: Timestamp | None = Field(None, description="When the batch's timed pause ends.")
    approval_expires_at: Timestamp | None = Field(
        None, description="While waiting for approval with a timeout: when the approval expires."
    )
    checks_since: Timestamp | None = Field(
        None,
        description="When the batch reached a point its webhooks hold it at: its canary ready (pre-traffic), or, "
        "the last batch, its pause and gates passed (pre-promotion).",
    )


#: The timers as fields of the status itself, as a controller before ``batchTimes`` stored them.
_FLAT_BATCH_TIMES = {
    "batchStartedAt": "startedAt",
    "batchReadyAt": "readyAt",
    "nextCheckAt": "nextCheckAt",
    "approvalExpiresAt": "approvalExpiresAt",
}


class GreyReleaseStatus(_Camel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True, alias_generator=_camel)
    phase: Phase | None = Field(None, description="Where the release is (see How a release moves).")
    message: str = Field("", description="What the release is doing or why it stopped, in words.")
    batch: str = Field("", description="currentBatch/totalBatches, for kubectl get.")
    batch_state: BatchState | None = Field(
        None,
        description="While Progressing or Paused: Upscaling (the canary grows), Verifying (live: pause and "
        "analysis run) or WaitingForApproval (live, waiting for greyrelease.io/promote).",
    )
    current_batch: int = Field(0, description="The batch in progress, from 1.")
    total_batches: int = Field(0, description="Batches in the plan.")
    canary_weight: int = Field(0, description="Percent of traffic set for the canary.")
    canary_replicas: int = Field(0, description="Canary replicas of the live batch.")
    stable_replicas: int = Field(0, description="Stable replicas of the live batch.")
    stable_version: str = Field("", description="The version the stable Deployment runs.")
    target_version: str = Field("", description="The version being released (spec.targetVersion as seen).")
    target_name: str = Field("", description="The Deployment being released.")
    end_phase: OptionalPhase = Field(None, description="While RollingBack: the phase it ends in (Aborted or Failed).")
    stable_pod_template_hash: str = Field(
        "", description="pod-template-hash of the stable ReplicaSet, used to narrow Service selectors."
    )
    restore: Restore = Field(
        default_factory=Restore, description="What the release changed on the user's objects, to put back."
    )
    observed_generation: int = Field(0, description="The metadata.generation this status was planned from.")
    transitions: int | None = Field(
        None,
        description="How many transitions with Events the release has recorded. The Events of the next one "
        "are named after its number, so a transition planned again after a crash posts none of them twice.",
    )
    phase_started_at: Timestamp | None = Field(None, description="When the current phase began.")
    batch_times: BatchTimes = Field(
        default_factory=BatchTimes, description="The current batch's timers: when it began, went live, waits until."
    )
    queue_position: int | None = Field(None, description="While Queued: 1 for the next release to start.")
    last_promotion: str = Field("", description="The last greyrelease.io/promote honoured, with its batch and time.")
    conditions: list[Condition] = Field(default_factory=list, description="Kubernetes-style conditions.")
    metrics: list[MetricStatus] = Field(
        default_factory=list, description="Each metric's last value, verdict and check counts in this batch."
    )
    webhooks: list[WebhookStatus] = Field(
        default_factory=list, description="Each webhook's last answer, verdict and counts at its point of the batch."
    )
    awaiting_confirmation: str = Field(
        "", description="The confirm webhook whose yes the batch waits for (the Paused condition is True meanwhile)."
    )
    history: list[BatchRecord] = Field(
        default_factory=list, description="The last batches: when, how big, how they ended."
    )
    held: HeldTemplate | None = Field(
        None,
        description="Follow mode: the pod template the Deployment holds (paused) and that is released or waits "
        "to be; absent when nothing is held.",
    )
    stable: StableReplicaSet | None = Field(
        None, description="Follow mode: the ReplicaSet the Deployment's pods run, the stable of a release."
    )
    last_release: LastRelease | None = Field(None, description="The last release that ended, and how.")
    requests: list[RequestRecord] = Field(
        default_factory=list,
        description="Follow mode: the request annotations seen (one record each: its value, the release it is "
        "for, what it did). A value recorded here is not acted on again; the annotations are never removed.",
    )
    approvals: list[ApprovalRecord] = Field(
        default_factory=list, description="Follow mode: the batches of the release under way approved, in order."
    )
    notifications: list[NotificationStatus] = Field(
        default_factory=list,
        exclude=True,
        description="Each notification's last result, when it failed or first succeeded after a failure. "
        "Written by the notification sender alone: a pass never writes it (it is left out of what a pass "
        "serialises), so a pass and the sender never overwrite each other's fields.",
    )

    @model_validator(mode="before")
    @classmethod
    def _batch_times_of_an_earlier_controller(cls, data: Any) -> Any:
        """A status written before ``batchTimes`` existed had the current batch's timers as fields of its
        own (``batchStartedAt``, ``batchReadyAt``, ``nextCheckAt``, ``approvalExpiresAt``). When
        ``batchTimes`` is there, fields of that name left beside it are ignored."""
        if not isinstance(data, dict) or "batchTimes" in data or "batch_times" in data:
            return data
        if not any(name in data for name in _FLAT_BATCH_TIMES):
            return data
        times = {new: data[old] for old, new in _FLAT_BATCH_TIMES.items() if data.get(old) is not None}
        return {**{k: v for k, v in data.items() if k not in _FLAT_BATCH_TIMES}, "batchTimes": times}

    @model_validator(mode="before")
    @classmethod
    def _batch_state_of_an_earlier_controller(cls, data: Any) -> Any:
        """A status written before ``batchState`` existed told the batch's state otherwise: a live batch
        had ``batchReadyAt`` (``batchTimes.readyAt`` once upgraded, see above), and one waiting for
        approval said so in its message."""
        if not isinstance(data, dict) or "batchState" in data or "batch_state" in data:
            return data
        if data.get("phase") not in (Phase.PROGRESSING, Phase.PAUSED):  # the batch phases it knew
            return data
        if not _ready_at(data):
            state = BatchState.UPSCALING
        elif WAITING_TEXT in str(data.get("message") or ""):
            state = BatchState.WAITING_FOR_APPROVAL
        else:
            state = BatchState.VERIFYING
        return {**data, "batchState": state}


def _ready_at(status: dict[str, Any]) -> Any:
    """When the batch went live, as a status given to the model has it (stored, or built in Python; the
    timers in ``batchTimes`` or, from an earlier controller, beside it)."""
    times = status.get("batchTimes", status.get("batch_times"))
    if times is None:
        return status.get("batchReadyAt")
    if isinstance(times, BatchTimes):
        return times.ready_at
    return times.get("readyAt", times.get("ready_at")) if isinstance(times, dict) else None


class GreyRelease(_Camel):
    """A whole object as read from the API server (only what the controller uses)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: GreyReleaseSpec
    status: GreyReleaseStatus = Field(default_factory=GreyReleaseStatus)
