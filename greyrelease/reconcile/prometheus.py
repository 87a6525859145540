"""Prometheus, reached through prometheus-api-client: one PromQL query in, one :class:`Sample` out.

Transient failures (connection refused, timeouts, 5xx) are retried briefly with tenacity; what still
fails comes back as an error sample, which the gate counts as an error and never as a success.
"""

from __future__ import annotations

import math
from typing import Any

from prometheus_api_client import PrometheusConnect
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential
from urllib3.util.retry import Retry

from greyrelease.analysis.verdicts import Sample
from greyrelease.reconcile.metrics import QUERY, QUERY_ERRORS

ATTEMPTS = 3


class QueryError(Exception):
    pass


class Prometheus:
    def __init__(self, address: str, *, token: str | None = None, timeout: float = 5.0, verify: bool = True) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        # The client's own retries are off: tenacity decides, so a dead Prometheus costs seconds, not minutes.
        self._client = PrometheusConnect(
            url=address, headers=headers, disable_ssl=not verify, retry=Retry(total=0), timeout=timeout
        )

    @retry(
        stop=stop_after_attempt(ATTEMPTS),
        wait=wait_exponential(multiplier=0.2, max=1.0),
        retry=retry_if_exception_type(QueryError),
        reraise=True,
    )
    def _query(self, promql: str) -> list[dict[str, Any]]:
        try:
            return list(self._client.custom_query(promql))
        except Exception as err:  # the client raises requests' and its own errors
            raise QueryError(str(err).splitlines()[0][:200]) from err

    def sample(self, promql: str) -> Sample:
        """The single value of an instant query; no data for an empty result or NaN."""
        try:
            with QUERY.time():
                result = self._query(promql)
        except QueryError as err:
            QUERY_ERRORS.inc()
            return Sample(error=str(err))
        if not result:
            return Sample(value=None)
        if len(result) > 1:
            return Sample(error=f"query returned {len(result)} series; aggregate it to one (e.g. sum(...))")
        try:
            value = float(result[0]["value"][1])
        except (KeyError, IndexError, TypeError, ValueError) as err:
            return Sample(error=f"unexpected result: {err}")
        return Sample(value=None if math.isnan(value) else value)
