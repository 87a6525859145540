"""The hold's self-test, kept running: one loop per controller process (``greyrelease run``), started once
the admission webhook is served and registered, testing whenever a test is due
(:meth:`~greyrelease.reconcile.held.HeldSelfTest.due_in`: every ``--held-selftest-seconds`` after the last
test, which a runtime makes when it starts and a pass may make on demand; sooner while a result ``False``
waits to be confirmed). A standby, which drives no release, takes no part and sends nothing. What is
tested and why: :mod:`greyrelease.reconcile.held`.
"""

from __future__ import annotations

import asyncio
import logging

from greyrelease.reconcile.held import HeldSelfTest

log = logging.getLogger("greyrelease.held")

#: How often the loop looks whether a test is due (a pass's own test, or a runtime taking part, moves
#: when the next one is).
LOOK_SECONDS = 5.0


async def keep_testing(selftest: HeldSelfTest, look: float = LOOK_SECONDS) -> None:
    """Test when due, until cancelled; each test on a thread of its own (it waits on the API server)."""
    while True:
        due = selftest.due_in() if selftest.attached else look
        if due > 0:
            await asyncio.sleep(min(due, look))
            continue
        try:
            await asyncio.to_thread(selftest.run)
        except Exception as err:  # a bug, not an answer of the API server (those are results)
            log.warning(f"hold self-test failed: {err!r}")
            await asyncio.sleep(look)
