"""WarningThrottle: a burst per key and window, then a count of what was held back."""

from __future__ import annotations

import logging

import pytest

from remote_magic.wire.throttle import WarningThrottle


def test_warnings_past_the_burst_are_counted_and_reported_in_the_next_window(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    throttle = WarningThrottle(logging.getLogger("throttle-test"), burst=2, window_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="throttle-test"):
        for i in range(5):
            throttle.warning("peer-a", "bad message %d", i)
        throttle.warning("peer-b", "bad message from b")
        now[0] = 61.0
        throttle.warning("peer-a", "bad message %d", 5)
    assert [r.getMessage() for r in caplog.records] == [
        "bad message 0",
        "bad message 1",
        "bad message from b",
        "bad message 5 (3 similar warnings were held back in the last 60 s)",
    ]
