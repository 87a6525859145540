"""The audit log reader the reliability tests and the benchmarks count writes with: a long run rotates the
API server's audit log (--audit-log-maxsize), and the writes in the rotated files count too."""

from __future__ import annotations

import json
from pathlib import Path

from e2e.harness.reliability import audit_events, dry_run


def event(n: int) -> str:
    return json.dumps({"verb": "patch", "requestReceivedTimestamp": f"2026-12-06T13:00:{n:02d}.000000Z"}) + "\n"


def test_reads_the_rotated_backups_oldest_first(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    (tmp_path / "audit-2026-12-06T13-00-05.000.log").write_text(event(3) + event(4))
    (tmp_path / "audit-2026-12-06T13-00-02.000.log").write_text(event(1) + event(2))
    log.write_text(event(5) + '{"verb": "pat')  # the last line still being written
    (tmp_path / "other.log").write_text(event(9))

    seen = [int(ev["requestReceivedTimestamp"][17:19]) for ev in audit_events(log)]

    assert seen == [1, 2, 3, 4, 5]


def test_no_log_yet(tmp_path: Path) -> None:
    assert list(audit_events(tmp_path / "audit.log")) == []


def test_a_dry_run_is_told_by_its_query() -> None:
    def ev(uri: str) -> dict[str, str]:
        return {"verb": "patch", "requestURI": uri}

    assert dry_run(ev("/apis/apps/v1/namespaces/shop/deployments/web?dryRun=All"))
    assert dry_run(ev("/apis/apps/v1/namespaces/shop/deployments/web?fieldManager=kubectl&dryRun=All"))
    assert not dry_run(ev("/apis/apps/v1/namespaces/shop/deployments/web?fieldManager=greyrelease"))
    assert not dry_run({"verb": "patch"})
