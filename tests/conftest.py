"""Shared by the unit tests. The tree mirrors the package: the tests of ``greyrelease/<package>/`` are in
``tests/<package>/``; those of the benchmark and end-to-end tools in ``tests/bench/`` and ``tests/e2e/``. What
the tests build and the faults they inject are in ``tests/support/``."""

from __future__ import annotations

import pytest

# The support modules assert too (a world that applies an action it does not know, a helper that steps a
# release into a state): their failures are reported as the tests' own are.
pytest.register_assert_rewrite("tests.support")

from greyrelease.kube.memory import MemoryKube  # noqa: E402

from tests.support.builders import cluster  # noqa: E402


@pytest.fixture
def kube() -> MemoryKube:
    """The release of ``web`` (three batches to ``v2``) on its Deployment and Service, rolled out."""
    return cluster()
