"""The memory profile of a profiling run: SIGUSR1 writes where the allocations are."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from greyrelease.runtime import memprofile


def test_sigusr1_writes_the_largest_allocation_sites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "memory.txt"
    monkeypatch.setenv(memprofile.ENV, str(out))
    previous = signal.getsignal(signal.SIGUSR1)
    memprofile.enable()
    try:
        held = [bytearray(1024) for _ in range(4096)]  # 4 MiB from this line
        os.kill(os.getpid(), signal.SIGUSR1)
        text = out.read_text()
    finally:
        tracemalloc.stop()
        signal.signal(signal.SIGUSR1, previous)
    assert text.startswith("traced: ")
    assert "held = [bytearray(1024)" in text.splitlines()[2]  # the largest site first
    # and what a full garbage collection walks, by type: the 4,096 bytearrays are not containers
    tracked = text[text.index("tracked by the garbage collector: ") :].splitlines()
    assert int(tracked[0].split(": ")[1].split()[0]) > 0 and "bytearray" not in text[text.index("tracked by") :]
    assert any(line.split()[-1] == "dict" for line in tracked[1:])
    assert len(held) == 4096


def test_without_the_variable_nothing_is_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(memprofile.ENV, raising=False)
    memprofile.enable()
    assert not tracemalloc.is_tracing()


def test_a_new_high_keeps_the_peak_for_a_later_report(tmp_path: Path) -> None:
    out = tmp_path / "memory.txt.peak"
    stop = threading.Event()
    tracemalloc.start(memprofile.FRAMES)
    watcher = threading.Thread(target=memprofile.watch_peak, args=(out,), kwargs={"every": 0.05, "stop": stop})
    watcher.start()
    try:
        deadline = time.monotonic() + 20
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out.exists(), "no snapshot kept at the start"
        peak = bytearray(64 * 2**20)  # one block: in a snapshot whole or not at all
        kept = ""
        while "peak = bytearray(" not in kept and time.monotonic() < deadline:
            time.sleep(0.05)
            kept = memprofile.report(tracemalloc.Snapshot.load(str(out)))
    finally:
        stop.set()
        watcher.join()
        tracemalloc.stop()
    del peak  # gone from the process, still in the kept snapshot
    text = subprocess.run(
        [sys.executable, "-m", "greyrelease.runtime.memprofile", str(out)], capture_output=True, text=True, check=True
    ).stdout
    assert float(text.split()[1]) >= 64
    assert "peak = bytearray(64 * 2**20)" in text.splitlines()[2]


def test_with_no_frames_nothing_is_traced_and_sigusr1_writes_the_census(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "memory.txt"
    monkeypatch.setenv(memprofile.ENV, str(out))
    monkeypatch.setenv(memprofile.FRAMES_ENV, "0")
    previous = signal.getsignal(signal.SIGUSR1)
    memprofile.enable()
    try:
        assert not tracemalloc.is_tracing()
        held = [{"name": f"release-{i}"} for i in range(1000)]  # 1,000 dicts and 1,000 distinct strings
        os.kill(os.getpid(), signal.SIGUSR1)
        text = out.read_text()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert text.startswith("tracked by the garbage collector: ")  # no allocation sites without tracing
    strings = next(line for line in text.splitlines() if line.startswith("strings in those dicts and lists: "))
    assert int(strings.split(": ")[1].split()[0]) >= 1000
    assert len(held) == 1000


def test_a_frame_count_that_is_not_a_number_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(memprofile.ENV, "/dev/null")
    monkeypatch.setenv(memprofile.FRAMES_ENV, "twelve")
    with pytest.raises(SystemExit, match="GREYRELEASE_TRACEMALLOC_FRAMES must be a whole number"):
        memprofile.enable()
    assert not tracemalloc.is_tracing()
