"""A runner's counters (DB retries, takeovers, stage claims waited on), kept in memory and
added to the store's shared counters (`store.counters`) whenever the database answers."""

import threading
from collections import Counter


class RunnerCounters:
    """Thread-safe counts; `take()` hands over those not yet stored, `restore()` gives them
    back when storing them failed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: Counter[str] = Counter()
        self.totals: Counter[str] = Counter()

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._pending[name] += n
            self.totals[name] += n

    def take(self) -> dict[str, int]:
        with self._lock:
            pending = dict(self._pending)
            self._pending.clear()
        return pending

    def restore(self, pending: dict[str, int]) -> None:
        with self._lock:
            self._pending.update(pending)
