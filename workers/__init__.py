"""jax + ray: build stage programs from layers, shard, compile, time and measure them."""

from typing import Any

from workers.fingerprint import stage_fingerprint

__all__ = ["measure_stage", "measure_stage_on", "stage_fingerprint"]


def __getattr__(name: str) -> Any:
    # measure imports jax: loaded on first use, so `import workers` leaves XLA_FLAGS settable
    if name in ("measure_stage", "measure_stage_on"):
        from workers import measure

        return getattr(measure, name)
    raise AttributeError(f"module 'workers' has no attribute {name!r}")
