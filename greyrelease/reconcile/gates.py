"""The gates' inputs: each metric of a release queried in Prometheus, for the canary (and the stable
track where compared), and the webhooks due called (:mod:`.webhooks`). Prometheus clients are kept per
address and credentials; a bearer token comes from the Secret the spec names, read in the release's
namespace."""

from __future__ import annotations

import base64
import threading
from datetime import datetime

from greyrelease.analysis.verdicts import Check, Sample, render_query
from greyrelease.analysis.verdicts import due as _due
from greyrelease.analysis.webhooks import Answer
from greyrelease.api.release import Analysis, GreyReleaseSpec, GreyReleaseStatus, Obj, Webhook, parse_duration
from greyrelease.kube.protocol import Kube, path
from greyrelease.reconcile.prometheus import Prometheus
from greyrelease.reconcile.webhooks import Webhooks


def due(spec: GreyReleaseSpec, status: GreyReleaseStatus, now: datetime) -> bool:
    """Whether this pass should query the metrics (a live batch whose next check time has come)."""
    if spec.analysis is None or not spec.analysis.metrics:
        return False
    return _due(
        spec.analysis,
        phase=status.phase,
        batch_ready_at=status.batch_times.ready_at,
        statuses=list(status.metrics),
        now=now,
    )


class Gates:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.webhooks = Webhooks(kube)
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, str | None, str, bool], Prometheus] = {}

    def prometheus_for(self, namespace: str, analysis: Analysis) -> Prometheus:
        """A client for the spec's Prometheus; ValueError when its bearer token cannot be read."""
        prom = analysis.prometheus
        if prom is None:
            raise ValueError("spec.analysis.prometheus: needed for metrics")
        token = None
        if prom.bearer_token_secret is not None:
            ref = prom.bearer_token_secret
            secret = self.kube.get(path("", "v1", "secrets", namespace, ref.name)) or {}
            raw = (secret.get("data") or {}).get(ref.key)
            if raw is None:
                raise ValueError(
                    f"spec.analysis.prometheus.bearerTokenSecret: no key {ref.key!r} in Secret {ref.name!r}"
                )
            token = base64.b64decode(raw).decode().strip()
        key = (prom.address, token, prom.timeout, prom.insecure_skip_verify)
        with self._lock:
            if key not in self._clients:
                self._clients[key] = Prometheus(
                    prom.address,
                    token=token,
                    timeout=parse_duration(prom.timeout),
                    verify=not prom.insecure_skip_verify,
                )
            return self._clients[key]

    def checks(self, release: Obj, spec: GreyReleaseSpec, status: GreyReleaseStatus) -> tuple[Check, ...]:
        """Query every metric for the canary (and the stable track where compared). Errors are samples."""
        assert spec.analysis is not None
        if not spec.analysis.metrics:
            return ()
        meta = release["metadata"]
        try:
            prom = self.prometheus_for(meta["namespace"], spec.analysis)
        except ValueError as err:
            return tuple(Check(m.name, Sample(error=str(err))) for m in spec.analysis.metrics)
        values = {
            "namespace": meta["namespace"],
            "name": meta["name"],
            "app": spec.app_name or status.target_name,
            "batch": status.current_batch,
        }
        checks = []
        for metric in spec.analysis.metrics:
            query = metric.query
            # Follow mode: the template's digest (the canary's greyrelease.io/version label), as the stable's.
            version = spec.target_version or status.restore.template or ""
            canary = prom.sample(render_query(query, track="canary", version=version, **values))
            stable = None
            if metric.compare is not None:
                stable = prom.sample(render_query(query, track="stable", version=status.stable_version, **values))
            checks.append(Check(metric.name, canary, stable))
        return tuple(checks)

    def answers(
        self,
        release: Obj,
        spec: GreyReleaseSpec,
        status: GreyReleaseStatus,
        webhooks: tuple[Webhook, ...],
        now: datetime,
    ) -> tuple[Answer, ...]:
        """Call the webhooks due (side by side, each within its timeout); an error is an answer too."""
        return self.webhooks.answers(release, spec, status, webhooks, now)
