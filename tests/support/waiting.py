"""The one polling loop with a deadline the tests use."""

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T | None],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = 0.2,
    check: Callable[[], object] | None = None,
) -> T:
    """Call `predicate` every `interval_s` seconds until it returns something truthy, and
    return that. `check`, called after each try that found nothing, may fail first (a
    process that died). Fails naming `what` when `timeout_s` seconds pass."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if check is not None:
            check()
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(interval_s)
