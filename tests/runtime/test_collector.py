"""The garbage collector's settings: thresholds from the environment or the defaults, a clear error naming
the variable, and what exists once started is frozen."""

from __future__ import annotations

import gc
import platform
from collections.abc import Iterator

import pytest
from greyrelease.runtime import collector


@pytest.fixture(autouse=True)
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_the_defaults_unless_the_variable_says_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(collector.ENV, raising=False)
    collector.configure()
    assert gc.get_threshold() == collector.THRESHOLDS
    monkeypatch.setenv(collector.ENV, "700,10,10")
    collector.configure()
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize("text", ["50000", "a,b,c", "1,2,-3", "1,2,3,4"])
def test_thresholds_that_are_not_three_counts_are_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match=f"{collector.ENV}=.*three non-negative integers"):
        collector.thresholds(text)


def test_settle_freezes_what_the_process_holds() -> None:
    held = [[i] for i in range(1000)]  # containers the collector tracks
    collector.settle()
    assert gc.get_freeze_count() >= len(held)
    assert not any(o is held for o in gc.get_objects())  # frozen objects are not walked any more


def test_two_malloc_arenas_unless_the_environment_sets_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert not collector.limit_arenas()  # glibc read it at start; it is not overridden
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc's mallopt only (the image is Debian)")
    assert collector.limit_arenas()


def test_run_refuses_bad_thresholds_before_starting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from greyrelease.cli.main import main

    monkeypatch.setenv(collector.ENV, "lots")
    assert main(["run", "--no-leader-elect"]) == 2
    assert f"{collector.ENV}='lots'" in capsys.readouterr().err
