"""The pod network's slots (e2e/harness/podnet.py): a cluster with more pods than a slot addresses claims
adjacent slots, one CIDR, and gives them all back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from e2e.harness import podnet
from e2e.harness.podnet import PodNetSlot, claim_slot, release_slot, units_for


@pytest.fixture
def slots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(podnet, "slots_dir", lambda: tmp_path)
    monkeypatch.setattr(podnet, "remove_netns", lambda name: None)
    return tmp_path


def test_the_slots_needed_grow_by_powers_of_two() -> None:
    assert [units_for(p) for p in (0, 16_382, 16_383, 23_000, 32_766, 32_767, 65_534)] == [1, 1, 2, 2, 2, 4, 4]
    with pytest.raises(ValueError, match=r"more than the 10\.244\.0\.0/16"):
        units_for(65_535)


def test_adjacent_slots_are_one_cidr() -> None:
    assert PodNetSlot(1).pod_cidr == "10.244.64.0/18"
    assert PodNetSlot(2, 2).pod_cidr == "10.244.128.0/17"
    assert PodNetSlot(0, 4).pod_cidr == "10.244.0.0/16"


def test_a_wide_claim_skips_a_pair_with_a_slot_taken_and_releases_all_it_holds(slots: Path) -> None:
    taken = claim_slot()
    assert taken == PodNetSlot(0)
    wide = claim_slot(2)
    assert wide == PodNetSlot(2, 2)
    assert sorted(p.name for p in slots.iterdir()) == ["slot-0", "slot-2", "slot-3"]  # slot 1 was given back
    assert (slots / "slot-3").read_text() == str(os.getpid())
    with pytest.raises(RuntimeError, match="no 4 adjacent"):
        claim_slot(4)
    release_slot(wide)
    assert sorted(p.name for p in slots.iterdir()) == ["slot-0"]
    release_slot(taken)
    assert claim_slot(4) == PodNetSlot(0, 4)
