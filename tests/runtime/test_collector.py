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


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_free_memory_is_handed_back_once_a_burst_is_over_and_not_at_rest() -> None:
    """A trim after at least ``after`` passes, ``every`` seconds after the last, when the pass ending is the
    only one running; never while a trim runs; and the count starts again after each."""
    calls: list[int] = []

    def trim(pad: int) -> int:
        calls.append(pad)
        return 1

    clock = Clock()
    trimmer = collector.Trimmer(every=60, after=3, trim=trim, clock=clock)
    clock.now = 61.0
    assert [trimmer.passed(alone=False) for _ in range(5)] == [False] * 5  # a burst under way
    assert trimmer.passed(alone=True)  # its last pass
    assert not trimmer.passed(alone=True)  # a trim is running already
    trimmer.trim()
    assert calls == [0] and trimmer.trims == 1
    clock.now = 200.0
    assert [trimmer.passed(alone=True) for _ in range(3)] == [False, False, True]  # three passes again
    trimmer.trim()
    clock.now = 230.0
    assert [trimmer.passed(alone=True) for _ in range(5)] == [False] * 5  # within a minute of the last


def test_a_trim_hands_glibc_s_free_memory_back() -> None:
    """On glibc: memory freed by Python (many mid-sized blocks, which glibc keeps in its heap rather than
    give back) is resident until the trim, and gone from the resident set after it."""
    trim = collector._malloc_trim()
    if trim is None:
        pytest.skip("not glibc")

    def anonymous() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) * 1024

    trim(0)
    blocks = [bytearray(3000) for _ in range(40_000)]  # 120 MB in blocks glibc serves from its heap
    kept = blocks[::100]  # one in a hundred stays: the heap cannot shrink from its top
    del blocks
    before = anonymous()
    trimmer = collector.Trimmer(every=0, after=1)
    assert trimmer.passed(alone=True)
    trimmer.trim()
    after = anonymous()
    print(f"resident anonymous memory {before / 2**20:.1f} -> {after / 2**20:.1f} MiB")
    assert before - after > 60 * 2**20
    assert len(kept) == 400
