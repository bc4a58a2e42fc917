"""JAX's persistent compilation cache in a measuring process, and which compiles it served.

`enable_compile_cache` points jax at the directory of `STAGEPROF_COMPILE_CACHE_DIR` (default
`~/.cache/stageprof/xla`, shared by the actors of a machine and by later jobs; `off` turns it
off) once per process, before its first compile: jax fixes its cache at the first compile
that finds a directory set. Every executable is written, however quick its compile or small
(jax's defaults skip those under 1 s). The cache key is jax's: the optimized module, the
compile options and devices, the backend and jax/XLA versions, so an entry is only served to
the same program on the same kind of devices.

`counting_cache_hits` says whether a compile was served by the cache: jax records the event
`/jax/compilation_cache/cache_hits` in the compiling thread for each executable it loads.
"""

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import jax

from schemas.settings import env_settings

logger = logging.getLogger(__name__)

CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"

_lock = threading.Lock()
_enabled: list[str | None] = []  # the first call's answer, once it was made
_counts = threading.local()
_listening = False


def enable_compile_cache(directory: str | None = None) -> str | None:
    """Turn jax's persistent compilation cache on at `directory` (default: the setting's),
    or off when the setting is off; the directory in use, or None when off. Only the first
    call of a process decides (later calls return its answer)."""
    with _lock:
        if _enabled:
            return _enabled[0]
        path = directory if directory is not None else env_settings().compile_cache_path
        if path is None:
            jax.config.update("jax_enable_compilation_cache", False)
        else:
            jax.config.update("jax_enable_compilation_cache", True)
            jax.config.update("jax_compilation_cache_dir", path)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        _enabled.append(path)
        logger.info("persistent compilation cache: %s", path or "off")
        return path


@dataclass
class CacheHits:
    """The cache hits of the compiles in a `counting_cache_hits` block (0 when none)."""

    count: int = 0

    @property
    def hit(self) -> bool:
        return self.count > 0


@contextmanager
def counting_cache_hits() -> Iterator[CacheHits]:
    """Count this thread's compilation cache hits inside the block."""
    _listen()
    hits = CacheHits()
    before = _thread_hits()
    try:
        yield hits
    finally:
        hits.count = _thread_hits() - before


def _thread_hits() -> int:
    return int(getattr(_counts, "hits", 0))


def _on_event(event: str, **_: Any) -> None:
    if event == CACHE_HIT_EVENT:
        _counts.hits = _thread_hits() + 1


def _listen() -> None:
    """Register the event listener, once per process."""
    global _listening
    with _lock:
        if not _listening:
            jax.monitoring.register_event_listener(_on_event)
            _listening = True
