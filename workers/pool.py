"""A pool of Ray actors that measure stage candidates, each actor owning its devices.

Failures are data: a candidate past its time limit, or whose actor died twice, comes back
as a `StageProfileResult` with status `timeout` or `worker_lost`, never as an exception.
"""

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from schemas import (
    ClusterSpec,
    ModelSpec,
    PlanOptions,
    ProfileStatus,
    StageKey,
    StageProfileResult,
)

logger = logging.getLogger(__name__)

# Extra wall time a candidate gets on top of its own limit before its actor is killed:
# the actor enforces the limit between phases, the pool enforces it on a stuck compile.
KILL_GRACE_S = 10.0
ACTOR_START_TIMEOUT_S = 120.0
INFO_POLL_S = 0.25


@dataclass(frozen=True)
class RetryPolicy:
    """How often a candidate whose actor died is tried before it is `worker_lost`."""

    max_attempts: int = 2


@dataclass(frozen=True)
class PoolConfig:
    """How many actors, and how many devices each owns."""

    num_workers: int = 1
    devices_per_worker: int = 4
    use_gpus: bool = False
    cpus_per_worker: float = 1.0
    kill_grace_s: float = KILL_GRACE_S


@dataclass(frozen=True)
class MeasureTask:
    """One distinct stage to measure, as the candidate `key` it was first seen as."""

    fingerprint: str
    key: StageKey


@dataclass
class _Slot:
    actor: Any
    task: MeasureTask | None = None
    ref: Any = None
    started: float = 0.0


@dataclass
class _Attempts:
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, fingerprint: str) -> int:
        self.counts[fingerprint] = self.counts.get(fingerprint, 0) + 1
        return self.counts[fingerprint]


# Measurement settings of this process that its actors follow (workers.quiet, timing).
FORWARDED_ENV = ("STAGEPROF_QUIET_TIMING", "STAGEPROF_LOCK_DIR", "STAGEPROF_TIMING_CLOCK")


def worker_env(devices: int, use_gpus: bool) -> dict[str, str]:
    """Environment of an actor process: N virtual CPU devices unless it has GPUs, and this
    process's measurement settings (`FORWARDED_ENV`)."""
    forwarded = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    if use_gpus:
        return forwarded
    flags = os.environ.get("XLA_FLAGS", "")
    flags = " ".join(f for f in flags.split() if "xla_force_host_platform_device_count" not in f)
    flags = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    return {"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", **forwarded}


class ProfileWorker:
    """Ray actor body: measures candidates on the devices of its own process."""

    def __init__(self) -> None:
        import jax

        self._spec_cache: dict[str, ModelSpec] = {}
        self._devices = jax.devices()

    def info(self) -> dict[str, Any]:
        import jax

        return {
            "device_kind": self._devices[0].device_kind,
            "num_devices": len(self._devices),
            "jax_version": jax.__version__,
            "pid": os.getpid(),
        }

    def measure(
        self,
        model_key: str,
        spec: ModelSpec,
        fingerprint: str,
        key: StageKey,
        cluster: ClusterSpec,
        options: PlanOptions,
    ) -> StageProfileResult:
        from workers.measure import measure_stage

        spec = self._spec_cache.setdefault(model_key, spec)
        result = measure_stage(spec, key, cluster, options, devices=self._devices)
        return result.model_copy(update={"fingerprint": fingerprint, "key": key})


class MeasurePool:
    """Fans distinct stages out to actors; `poll()` returns finished results."""

    def __init__(
        self,
        config: PoolConfig,
        *,
        model_key: str,
        spec: ModelSpec,
        cluster: ClusterSpec,
        options: PlanOptions,
        failure_result: Any,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.config = config
        self.retry = retry or RetryPolicy()
        self._model_key = model_key
        self._spec_ref = ray.put(spec)
        self._cluster = cluster
        self._options = options
        self._failure_result = failure_result
        self._queue: deque[MeasureTask] = deque()
        self._attempts = _Attempts()
        self._slots = [_Slot(actor=self._new_actor()) for _ in range(config.num_workers)]
        self.actors_replaced = 0

    def _new_actor(self) -> Any:
        cls = ray.remote(ProfileWorker)
        opts: dict[str, Any] = {
            "num_cpus": self.config.cpus_per_worker,
            "runtime_env": {
                "env_vars": worker_env(self.config.devices_per_worker, self.config.use_gpus)
            },
            "max_restarts": 0,
            "max_concurrency": 2,  # `info` answers while a candidate is measured
        }
        if self.config.use_gpus:
            opts["num_gpus"] = self.config.devices_per_worker
        return cls.options(**opts).remote()

    def info(self, check: Callable[[], None] | None = None) -> dict[str, Any]:
        """Device kind, device count and jax version of the actors (from the first one).

        Waits for the actor to start (up to `ACTOR_START_TIMEOUT_S`), calling `check` a few
        times a second so that a cancel or a shutdown can interrupt the start-up."""
        ref = self._slots[0].actor.info.remote()
        deadline = time.monotonic() + ACTOR_START_TIMEOUT_S
        while True:
            ready, _ = ray.wait([ref], timeout=INFO_POLL_S)
            if ready:
                return ray.get(ref)
            if check is not None:
                check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no actor answered within {ACTOR_START_TIMEOUT_S:g} s")

    def submit(self, task: MeasureTask) -> None:
        self._queue.append(task)
        self._dispatch()

    @property
    def busy(self) -> bool:
        return bool(self._queue) or any(s.task is not None for s in self._slots)

    @property
    def in_flight(self) -> int:
        return len(self._queue) + sum(s.task is not None for s in self._slots)

    def _dispatch(self) -> None:
        for slot in self._slots:
            if slot.task is None and self._queue:
                task = self._queue.popleft()
                slot.task, slot.started = task, time.monotonic()
                slot.ref = slot.actor.measure.remote(
                    self._model_key,
                    self._spec_ref,
                    task.fingerprint,
                    task.key,
                    self._cluster,
                    self._options,
                )

    def poll(self, timeout_s: float = 1.0) -> list[StageProfileResult]:
        """Wait up to `timeout_s` for results; timed-out or lost candidates are results too."""
        running = [s for s in self._slots if s.task is not None]
        if not running:
            self._dispatch()
            return []
        ready, _ = ray.wait([s.ref for s in running], num_returns=1, timeout=timeout_s)
        ready_ids = {r.hex() for r in ready}
        results: list[StageProfileResult] = []
        limit = self._options.candidate_timeout_s + self.config.kill_grace_s
        now = time.monotonic()
        for slot in running:
            task = slot.task
            assert task is not None
            if slot.ref.hex() in ready_ids:
                results.extend(self._collect(slot, task))
            elif now - slot.started > limit:
                logger.warning("candidate %s past %.0f s; replacing its actor", task.key, limit)
                self._replace(slot)
                results.append(
                    self._failure_result(
                        task,
                        ProfileStatus.timeout,
                        f"no result after {now - slot.started:.1f} s (limit "
                        f"{self._options.candidate_timeout_s:g} s); the worker was stopped",
                    )
                )
        self._dispatch()
        return results

    def _collect(self, slot: _Slot, task: MeasureTask) -> list[StageProfileResult]:
        try:
            result = ray.get(slot.ref)
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as err:
            attempt = self._attempts.add(task.fingerprint)
            logger.warning("worker died measuring %s (attempt %d): %s", task.key, attempt, err)
            self._replace(slot)
            if attempt < self.retry.max_attempts:
                self._queue.appendleft(task)
                return []
            return [
                self._failure_result(
                    task,
                    ProfileStatus.worker_lost,
                    f"the worker died {attempt} times measuring this candidate: {err}",
                )
            ]
        except ray.exceptions.RayTaskError as err:
            slot.task = slot.ref = None
            return [self._failure_result(task, ProfileStatus.runtime_error, str(err))]
        slot.task = slot.ref = None
        return [result]

    def _replace(self, slot: _Slot) -> None:
        ray.kill(slot.actor, no_restart=True)
        slot.actor = self._new_actor()
        slot.task = slot.ref = None
        self.actors_replaced += 1

    def stop_all(self) -> None:
        """Drop queued work and kill every busy actor (cancellation)."""
        self._queue.clear()
        for slot in self._slots:
            if slot.task is not None:
                self._replace(slot)

    def shutdown(self) -> None:
        for slot in self._slots:
            ray.kill(slot.actor, no_restart=True)
        self._slots = []

    def actor_pids(self) -> list[int]:
        """Process ids of the actors (tests kill one)."""
        return [
            ray.get(s.actor.info.remote(), timeout=ACTOR_START_TIMEOUT_S)["pid"]
            for s in self._slots
        ]
