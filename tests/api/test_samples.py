"""Every sample under config/samples is a spec the models accept (what the API server's CRD schema is
generated from), so a sample a user copies is never refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from greyrelease.api.release import GreyReleasePolicySpec, GreyReleaseSpec

SAMPLES = sorted((Path(__file__).resolve().parents[2] / "config" / "samples").glob("greyrelease.io_v1_*.yaml"))


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_each_sample_is_a_valid_spec(sample: Path) -> None:
    doc = yaml.safe_load(sample.read_text())
    model = GreyReleasePolicySpec if doc["kind"] == "GreyReleasePolicy" else GreyReleaseSpec
    model.model_validate(doc["spec"])


def test_there_is_a_sample_of_each_mode() -> None:
    docs = [yaml.safe_load(s.read_text()) for s in SAMPLES]
    releases = [d["spec"] for d in docs if d["kind"] == "GreyRelease"]
    assert any("targetVersion" in r for r in releases) and any("targetVersion" not in r for r in releases)
