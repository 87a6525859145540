"""Who may hold the Lease: pure."""

from datetime import UTC, datetime, timedelta

from greyrelease.leader import claim

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def held_by(who: str, ago: float) -> dict:
    t = (NOW - timedelta(seconds=ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"holderIdentity": who, "leaseDurationSeconds": 10, "renewTime": t, "acquireTime": t, "leaseTransitions": 3}


def test_free_lease_is_taken() -> None:
    spec = claim({}, "a", NOW, 10)
    assert spec is not None and spec["holderIdentity"] == "a" and spec["leaseTransitions"] == 0


def test_live_lease_of_another_is_respected() -> None:
    assert claim(held_by("b", 5), "a", NOW, 10) is None


def test_expired_lease_is_taken_over_and_counted() -> None:
    spec = claim(held_by("b", 11), "a", NOW, 10)
    assert spec is not None and spec["holderIdentity"] == "a" and spec["leaseTransitions"] == 4


def test_own_lease_is_renewed_without_a_transition() -> None:
    spec = claim(held_by("a", 2), "a", NOW, 10)
    assert spec is not None and spec["leaseTransitions"] == 3 and spec["renewTime"].startswith("2026-01-01T12:00:00")


def test_released_lease_is_free() -> None:
    spec = claim({**held_by("b", 1), "holderIdentity": ""}, "a", NOW, 10)
    assert spec is not None and spec["holderIdentity"] == "a"
