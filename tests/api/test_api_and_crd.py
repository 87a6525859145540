"""The models, the CRD generated from them, and the small pure helpers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from greyrelease.api.crd import render
from greyrelease.api.release import GreyReleaseSpec, GreyReleaseStatus, fmt_time, parse_duration, parse_time
from greyrelease.planner.batches import PlanError, expand
from greyrelease.planner.images import label_value, split_tag, target_image, version_of
from pydantic import ValidationError

ROOT = Path(__file__).resolve().parents[2]  # the repository: tests/<package>/test_*.py


@pytest.mark.parametrize("name", ["greyrelease.io_greyreleases.yaml", "greyrelease.io_greyreleasepolicies.yaml"])
def test_checked_in_crds_are_what_the_models_generate(name: str) -> None:
    path = f"crds/{name}"
    assert (ROOT / path).read_text() == render(name), f"{path} is stale: run `make crds`"


def test_the_crds_have_one_source_that_config_refers_to() -> None:
    crds = yaml.safe_load((ROOT / "crds/kustomization.yaml").read_text())
    assert crds["resources"] == ["greyrelease.io_greyreleases.yaml", "greyrelease.io_greyreleasepolicies.yaml"]
    assert yaml.safe_load((ROOT / "config/crd/kustomization.yaml").read_text())["resources"] == ["../../crds"]
    assert [p.name for p in (ROOT / "config/crd").iterdir()] == ["kustomization.yaml"]


def test_crd_carries_the_seed_fields_printer_columns_and_status_subresource() -> None:
    crd = yaml.safe_load(render())
    version = crd["spec"]["versions"][0]
    props = version["schema"]["openAPIV3Schema"]["properties"]
    for field in ("appName", "targetVersion", "batchSize", "canaryWeight"):
        assert field in props["spec"]["properties"]
    for field in ("currentBatch", "phase"):
        assert field in props["status"]["properties"]
    assert props["spec"]["properties"]["canaryWeight"]["maximum"] == 100
    assert props["spec"]["properties"]["batchSize"]["minimum"] == 1
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:6] == ["Phase", "Batch", "Weight", "Target", "Stable", "Age"]
    assert version["subresources"] == {"status": {}}
    assert crd["spec"]["names"]["shortNames"] == ["gr"]


BASE = {"targetRef": {"name": "web"}, "targetVersion": "v2"}


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({**BASE, "batchSize": 1}, "batchSize and canaryWeight go together"),
        ({**BASE, "batchSize": 1, "canaryWeight": 10, "batches": [{"replicas": 1}]}, "exactly one of batches"),
        (
            {"appName": "web", "targetRef": {"name": "web"}, "targetVersion": "v2", "batchSize": 1, "canaryWeight": 1},
            "exactly one of targetRef",
        ),
        ({**BASE, "batchSize": 1, "canaryWeight": 101}, "canaryWeight"),
        ({**BASE, "batchSize": 0, "canaryWeight": 10}, "batchSize"),
        ({**BASE, "batches": [{"replicas": 0}]}, "replicas"),
        ({**BASE, "batches": [{"replicas": "120%"}]}, "replicas"),
        (
            {**BASE, "batches": [{"replicas": 1, "weight": 50}, {"replicas": 2, "weight": 10}]},
            "weights must never decrease",
        ),
        ({**BASE, "batches": [{"replicas": 1, "pause": "soon"}]}, "pause"),
        ({**BASE, "targetVersion": "v 2", "batchSize": 1, "canaryWeight": 1}, "targetVersion"),
        ({**BASE, "batchSize": 1, "canaryWeight": 1, "colour": "grey"}, "colour"),
    ],
    ids=[
        "shorthand-half",
        "both-forms",
        "both-targets",
        "weight-over-100",
        "zero-batch-size",
        "zero-replicas",
        "percent-over-100",
        "decreasing-weights",
        "bad-duration",
        "space-in-version",
        "unknown-field",
    ],
)
def test_bad_specs_are_refused_naming_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        GreyReleaseSpec.model_validate(spec)
    assert field in str(err.value)


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("1m30s", 90), ("250ms", 0.25), ("2h", 7200), ("1.5m", 90)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("fields", "replicas", "table"),
    [
        ({"batchSize": 3, "canaryWeight": 25}, 10, [(3, 7, 30), (6, 4, 60), (9, 1, 90), (10, 0, 100)]),
        (
            {"batchSize": 3, "canaryWeight": 25, "trafficRouting": {"nginx": {"ingress": "i", "stableService": "s"}}},
            10,
            [(3, 10, 25), (6, 10, 50), (9, 10, 75), (10, 10, 100)],
        ),
        (
            {
                "batches": [{"replicas": "20%", "weight": 5}, {"replicas": "50%", "weight": 40}, {"replicas": 3}],
                "trafficRouting": {"gatewayAPI": {"httpRoute": "r", "stableService": "s"}},
            },
            10,
            [(2, 10, 5), (5, 10, 40), (10, 10, 100)],
        ),
        ({"batches": [{"replicas": 1}, {"replicas": 50}]}, 4, [(1, 3, 25), (4, 0, 100)]),
        ({"batchSize": 5, "canaryWeight": 50}, 3, [(3, 0, 100)]),
    ],
    ids=["shorthand-service", "shorthand-nginx", "percent-gateway", "clamped-to-replicas", "one-batch"],
)
def test_batch_tables(fields: dict[str, Any], replicas: int, table: list[tuple[int, int, int]]) -> None:
    steps = expand(GreyReleaseSpec.model_validate({**BASE, **fields}), replicas)
    assert [(s.canary_replicas, s.stable_replicas, s.weight) for s in steps] == table


def test_shorthand_pause_applies_to_every_batch_but_the_last() -> None:
    steps = expand(GreyReleaseSpec.model_validate({**BASE, "batchSize": 2, "canaryWeight": 50, "pause": "manual"}), 4)
    assert [s.pause for s in steps] == ["manual", None]


def test_a_deployment_with_zero_replicas_cannot_be_released() -> None:
    with pytest.raises(PlanError, match="0 replicas"):
        expand(GreyReleaseSpec.model_validate({**BASE, "batchSize": 1, "canaryWeight": 50}), 0)


@pytest.mark.parametrize(
    ("image", "version", "expected"),
    [
        ("nginx:1.25", "1.27", "nginx:1.27"),
        ("registry:5000/team/app:v1", "v2", "registry:5000/team/app:v2"),
        ("app", "v2", "app:v2"),
        ("app@sha256:abc", "v2", "app:v2"),
        ("nginx:1.25", "ghcr.io/acme/web:2.0", "ghcr.io/acme/web:2.0"),
    ],
)
def test_target_image(image: str, version: str, expected: str) -> None:
    assert target_image(image, version) == expected


def test_versions_and_label_values() -> None:
    assert split_tag("registry:5000/app") == ("registry:5000/app", "")
    assert version_of("registry:5000/app:v1") == "v1"
    assert label_value("ghcr.io/acme/web:2.0") == "ghcr.io-acme-web-2.0"
    assert len(label_value("x" * 100)) == 63


def test_readme_field_reference_is_current() -> None:
    from greyrelease.api.reference import markdown

    stale = "README field reference is stale: python -m greyrelease.api.reference"
    assert markdown() in (ROOT / "README.md").read_text(), stale


def test_timestamps_are_stored_as_rfc3339_utc_to_the_millisecond() -> None:
    from datetime import datetime, timedelta, timezone

    from greyrelease.api.release import BatchTimes, GreyReleaseStatus, parse_time

    at = datetime(2026, 1, 1, 13, 0, 0, 123456, tzinfo=timezone(timedelta(hours=1)))
    status = GreyReleaseStatus.model_validate({"phase": "Progressing", "phaseStartedAt": "2026-01-01T12:00:00.000Z"})
    dumped = status.model_copy(update={"batch_times": BatchTimes(ready_at=at)}).model_dump(by_alias=True, mode="json")
    assert dumped["phaseStartedAt"] == "2026-01-01T12:00:00.000Z"
    assert dumped["batchTimes"]["readyAt"] == "2026-01-01T12:00:00.123Z"
    assert parse_time(dumped["batchTimes"]["readyAt"]) == at.replace(microsecond=123000)
    assert parse_time("not a time") is None and parse_time(None) is None
    with pytest.raises(ValidationError, match="timezone"):
        GreyReleaseStatus.model_validate({"phaseStartedAt": "2026-01-01T12:00:00"})


def test_the_policy_sample_is_what_the_models_accept() -> None:
    from greyrelease.api.release import GreyReleasePolicy

    doc = yaml.safe_load((ROOT / "config/samples/greyrelease.io_v1_greyreleasepolicy.yaml").read_text())
    policy = GreyReleasePolicy.model_validate(doc)
    assert policy.spec.governs("shop", {}) and not policy.spec.governs("default", {})
    assert policy.spec.concurrency is not None and policy.spec.concurrency.max_progressing == 2


@pytest.mark.parametrize(
    ("t", "text"),
    [
        (datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC), "2026-01-01T12:00:00.000Z"),
        (datetime(2026, 1, 1, 12, 0, 0, 999999, tzinfo=UTC), "2026-01-01T12:00:00.999Z"),  # cut, not rounded
        (
            datetime(2026, 1, 1, 13, 30, 0, 1500, tzinfo=timezone(timedelta(hours=1, minutes=30))),
            "2026-01-01T12:00:00.001Z",
        ),
        (datetime(2026, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=-11))), "2026-01-01T11:30:00.000Z"),
        (datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone(timedelta(0), "Z")), "2026-01-01T12:00:00.000Z"),
    ],
)
def test_times_are_written_in_utc_to_the_millisecond(t: datetime, text: str) -> None:
    assert fmt_time(t) == text


def test_a_time_read_back_is_written_as_it_was_stored() -> None:
    """Read back through the model, a time is at pydantic's own zero offset, not UTC: written unchanged."""
    stored = {"phaseStartedAt": "2026-01-01T12:00:00.120Z", "batchTimes": {"readyAt": "2030-06-30T23:59:59.999Z"}}
    status = GreyReleaseStatus.model_validate(stored)
    assert status.phase_started_at is not None and status.phase_started_at.tzinfo is not UTC
    dumped = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert dumped["phaseStartedAt"] == stored["phaseStartedAt"]
    assert dumped["batchTimes"] == stored["batchTimes"]
    assert fmt_time(parse_time("2026-01-01T13:00:00.5+01:00") or datetime.min) == "2026-01-01T12:00:00.500Z"
