"""A pool of measuring groups (`workers.cluster.host_group`), one group shape at a time.

Stages are measured shape by shape, as Alpa does: for each shape the pool starts as many
groups as the Ray cluster's devices and CPUs fit (`workers.cluster.placement`), each in its own
placement group, runs them in parallel, and respawns them for the next shape. Failures are
data: a candidate past its time limit, or whose group lost a process twice, comes back as a
`StageProfileResult` with status `timeout` or `worker_lost`, never as an exception.
"""

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray import ObjectRef
from ray.util.placement_group import remove_placement_group

from schemas import (
    ClusterSpec,
    ModelSpec,
    PlanOptions,
    ProfileStatus,
    StageKey,
    StageProfileResult,
    SubmeshShape,
)
from workers.cluster.group_start import START_TIMEOUT_S, DevicesBusy, GroupStarter, WaitListener
from workers.cluster.host_group import MeasuringGroup, combine
from workers.cluster.placement import GroupShape, Layout, measuring_nodes

logger = logging.getLogger(__name__)

# Extra wall time a candidate gets on top of its own limit before its group is killed:
# the ranks enforce the limit between phases, the pool enforces it on a stuck compile.
KILL_GRACE_S = 10.0
# How long the other ranks of a group get to answer once one rank reported a failure
# (a rank that failed alone leaves the others waiting in a collective).
RANK_GRACE_S = 10.0
ACTOR_ERRORS = (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError)


@dataclass(frozen=True)
class CandidateRetry:
    """How often a candidate whose group lost a process is tried before it is `worker_lost`."""

    max_attempts: int = 2


@dataclass(frozen=True)
class PoolConfig:
    """How measuring processes are sized and how many groups run at once."""

    max_groups: int | None = None  # default: as many as the Ray cluster fits
    one_shape: int | None = None  # every process owns this many devices: no packing
    use_gpus: bool = False
    cpus_per_process: float = 1.0
    kill_grace_s: float = KILL_GRACE_S
    # How long the pool waits for devices another job holds before the stages of that shape
    # fail (the wait is reported after `group_start.WAIT_NOTICE_S`).
    device_wait_s: float = START_TIMEOUT_S


@dataclass(frozen=True)
class CandidateTask:
    """One distinct stage to measure, as the candidate `key` (on `submesh`) it was first
    seen as; `model_key` names the spec it is a stage of (`GroupPool.add_model`; empty: the
    pool's own); `unsplit`: measured without the split backward whatever the spec's options
    say (`PlanOptions.without_split_backward`)."""

    fingerprint: str
    key: StageKey
    submesh: SubmeshShape
    model_key: str = ""
    unsplit: bool = False


@dataclass
class _Attempts:
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, fingerprint: str) -> int:
        self.counts[fingerprint] = self.counts.get(fingerprint, 0) + 1
        return self.counts[fingerprint]


def make_layout(config: PoolConfig) -> Layout:
    """The Ray cluster's measuring nodes, sized as `config` says."""
    return Layout(
        nodes=measuring_nodes(config.use_gpus),
        use_gpus=config.use_gpus,
        cpus_per_process=config.cpus_per_process,
        one_shape=config.one_shape,
        max_groups=config.max_groups,
    )


class GroupPool:
    """Fans distinct stages out to groups; `poll()` returns finished results."""

    def __init__(
        self,
        config: PoolConfig,
        *,
        model_key: str,
        spec: ModelSpec,
        cluster: ClusterSpec,
        options: PlanOptions,
        failure_result: Callable[[CandidateTask, ProfileStatus, str], StageProfileResult],
        retry: CandidateRetry | None = None,
        layout: Layout | None = None,
        check: Callable[[], None] | None = None,
        on_wait: WaitListener | None = None,
    ) -> None:
        self.config = config
        self.retry = retry or CandidateRetry()
        self.layout = layout or make_layout(config)
        self._model_key = model_key
        self._cluster = cluster
        self._options = options
        # each spec the pool measures stages of, by model key: (its object ref, its options)
        self._models: dict[str, tuple[ObjectRef, PlanOptions]] = {}
        self.add_model(model_key, spec, options)
        self._failure_result = failure_result
        self._starter = GroupStarter(
            self.layout,
            check or (lambda: None),
            device_wait_s=config.device_wait_s,
            on_wait=on_wait,
        )
        self._queue: deque[CandidateTask] = deque()
        self._attempts = _Attempts()
        self._groups: list[MeasuringGroup] = []
        self._shape: GroupShape | None = None
        self._complete = True  # all groups of `_shape` that fit are started
        self._unplaced: list[StageProfileResult] = []
        self._wanted: int | None = None  # groups of the current shape the caller can use
        # Shapes none of whose groups was placed within `device_wait_s` (another job holds
        # their devices): this pool fails their stages at once from then on.
        self._busy: dict[GroupShape, str] = {}
        self.actors_replaced = 0
        self.shapes: list[GroupShape] = []  # every shape measured, in order

    # --- what the measuring loop sees ---------------------------------------------

    def add_model(self, model_key: str, spec: ModelSpec, options: PlanOptions) -> None:
        """Let the pool measure stages of `spec` (tasks naming `model_key`) with `options`:
        one pool serves the micro-batch sizes of a job that searches counts."""
        if model_key not in self._models:
            self._models[model_key] = (ray.put(spec), options)

    def info(self, submesh: SubmeshShape | None = None) -> dict[str, Any]:
        """Device kind, device count and jax version of the measuring processes (rank 0 of
        a first group, started for it if none runs: one of `submesh`'s shape, the shape the
        pool is likely to measure first)."""
        if not self._groups:
            probe = submesh or SubmeshShape(hosts=1, devices_per_host=1)
            self._switch(self.layout.shape_for(probe), 1)
        if not self._groups:
            raise RuntimeError(f"no Ray node can run a measuring process: {self.layout.describe()}")
        info = self._groups[0].info
        assert info is not None
        return info

    def accepts(self, submesh: SubmeshShape) -> bool:
        """Whether a stage on `submesh` would start now: a group of its shape is free or can
        still be started, or nothing runs (the pool then turns to its shape)."""
        if not self.busy:
            return True
        if self.layout.shape_for(submesh) != self._shape:
            return False
        room = sum(g.task is None for g in self._groups) + (0 if self._complete else 1)
        return len(self._queue) < room

    def submit(self, task: CandidateTask, wanted: int | None = None) -> None:
        """Queue `task`; `wanted`: how many groups of its shape the caller has stages for
        now (the pool asks Ray for no more; default: all that fit)."""
        self._queue.append(task)
        self._wanted = wanted
        self._dispatch()

    def release_idle(self) -> int:
        """Give back the groups that run nothing (their stages are done, and the caller has
        no more of their shape for now); returns how many."""
        idle = [g for g in self._groups if g.task is None] if not self._queue else []
        for group in idle:
            self._drop(group)
        if idle:
            self._complete = False
        return len(idle)

    @property
    def busy(self) -> bool:
        return bool(self._queue or self._unplaced) or any(g.task for g in self._groups)

    @property
    def actors_started(self) -> int:
        """Measuring processes started so far (respawns included)."""
        return self._starter.processes_started

    @property
    def groups(self) -> list[MeasuringGroup]:
        return list(self._groups)

    def poll(self, timeout_s: float = 1.0) -> list[StageProfileResult]:
        """Wait up to `timeout_s` for results; timed-out or lost candidates are results too."""
        self._dispatch()
        results, self._unplaced = self._unplaced, []
        running = [g for g in self._groups if g.task is not None]
        if not running:
            return results
        if not results:
            ray.wait([r for g in running for r in g.refs], num_returns=1, timeout=timeout_s)
        limit = self._options.candidate_timeout_s + self.config.kill_grace_s
        for group in running:
            results.extend(self._settle(group, limit))
        self._dispatch()
        return results

    def shutdown(self) -> None:
        for group in list(self._groups):
            self._drop(group)
        self._shape = None

    def actor_pids(self, running: bool = False) -> list[int]:
        """Process ids of the measuring processes (tests kill one); `running`: only those of
        groups measuring a stage now."""
        return [pid for g in self._groups if g.task is not None or not running for pid in g.pids]

    # --- shapes and groups ------------------------------------------------------------

    def _dispatch(self) -> None:
        while self._queue:
            task = self._queue[0]
            shape = self.layout.shape_for(task.submesh)
            if shape in self._busy:
                self._queue.popleft()
                self._unplaced.append(self._unplaceable(task, shape))
                continue
            if shape != self._shape:
                if any(g.task is not None for g in self._groups):
                    return  # the current shape finishes first
                self._switch(shape)
            free = self._free_group()
            if free is None and not self._complete:
                # a free group measures first: the one `info` started would otherwise wait
                # while the others start
                self._grow()
                free = self._free_group()
            if not self._groups:
                self._queue.popleft()
                self._unplaced.append(self._unplaceable(task, shape))
                continue
            if free is None:
                return
            self._queue.popleft()
            self._run(free, task)

    def _free_group(self) -> MeasuringGroup | None:
        return next((g for g in self._groups if g.task is None), None)

    def _run(self, group: MeasuringGroup, task: CandidateTask) -> None:
        group.task, group.started, group.first_done = task, time.monotonic(), None
        model_key = task.model_key or self._model_key
        spec_ref, options = self._models[model_key]
        if task.unsplit:
            options = options.without_split_backward()
        group.refs = [
            a.measure.remote(
                model_key,
                spec_ref,
                task.fingerprint,
                task.key,
                self._cluster,
                options,
            )
            for a in group.actors
        ]

    def _switch(self, shape: GroupShape, count: int | None = None) -> None:
        """Respawn the pool for `shape`: `count` groups (default: as many as the caller
        wants, at most all that fit)."""
        self.shutdown()
        self._shape = shape
        fit = self.layout.groups_that_fit(shape)
        count = self._wanted if count is None else count
        want = fit if count is None else min(count, fit)
        self._complete = want >= fit
        if want == 0:
            logger.warning("no room for a group of %s on %s", shape, self.layout.describe())
            return
        logger.info("measuring with %d group(s) of %s", want, shape)
        self.shapes.append(shape)
        try:
            self._groups = self._starter.new_groups(shape, want)
        except DevicesBusy as err:
            self._busy[shape] = str(err)

    def _grow(self) -> None:
        """More groups of the current shape, those Ray places at once: a pool that holds
        groups never waits for another job's devices."""
        assert self._shape is not None
        more = self.layout.groups_that_fit(self._shape) - len(self._groups)
        if self._wanted is not None:
            more = min(more, self._wanted - len(self._groups))
        self._complete = True
        if more > 0:
            try:
                self._groups.extend(
                    self._starter.new_groups(self._shape, more, holding=bool(self._groups))
                )
            except DevicesBusy as err:
                self._busy[self._shape] = str(err)

    def _drop(self, group: MeasuringGroup) -> None:
        group.kill()
        remove_placement_group(group.pg)
        self._groups.remove(group)
        if not self._groups:
            self._shape = None

    def _respawn(self, group: MeasuringGroup) -> None:
        """A new set of processes for `group` (after a death, a timeout or a rank failing
        alone); a group that cannot restart is dropped."""
        group.kill()
        self.actors_replaced += group.shape.processes
        try:
            self._starter.start([group])
        except Exception as err:
            logger.warning("dropping a group of %s that did not restart: %s", group.shape, err)
            remove_placement_group(group.pg)
            self._groups.remove(group)
            if not self._groups:
                self._shape = None

    # --- results ---------------------------------------------------------------------

    def _settle(self, group: MeasuringGroup, limit: float) -> list[StageProfileResult]:
        task = group.task
        assert task is not None
        done, pending = ray.wait(group.refs, num_returns=len(group.refs), timeout=0)
        answers = [_outcome(r) for r in done]
        lost = next((a for a in answers if isinstance(a, ACTOR_ERRORS)), None)
        if lost is not None:
            return self._lost(group, task, lost)
        if not pending:
            return [self._collect(group, task, answers)]
        now = time.monotonic()
        if done and group.first_done is None:
            group.first_done = now
        failed = [a for a in answers if isinstance(a, StageProfileResult) and not a.ok]
        if failed and group.first_done is not None and now - group.first_done > RANK_GRACE_S:
            logger.warning("a rank failed alone measuring %s; restarting its group", task.key)
            self._respawn(group)
            return [failed[0]]
        if now - group.started > limit:
            logger.warning("candidate %s past %.0f s; replacing its group", task.key, limit)
            self._respawn(group)
            return [
                self._failure_result(
                    task,
                    ProfileStatus.timeout,
                    f"no result after {now - group.started:.1f} s (limit "
                    f"{self._options.candidate_timeout_s:g} s); the worker was stopped",
                )
            ]
        return []

    def _collect(
        self, group: MeasuringGroup, task: CandidateTask, answers: list[Any]
    ) -> StageProfileResult:
        group.task, group.refs = None, []
        error = next((a for a in answers if isinstance(a, Exception)), None)
        if error is not None:
            if group.shape.processes > 1:  # the other ranks' state is unknown
                self._respawn(group)
            return self._failure_result(task, ProfileStatus.runtime_error, str(error))
        return combine(answers)

    def _lost(
        self, group: MeasuringGroup, task: CandidateTask, err: Exception
    ) -> list[StageProfileResult]:
        attempt = self._attempts.add(task.fingerprint)
        logger.warning("a process died measuring %s (attempt %d): %s", task.key, attempt, err)
        self._respawn(group)
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

    def _unplaceable(self, task: CandidateTask, shape: GroupShape) -> StageProfileResult:
        why = self._busy.get(shape) or (
            f"submesh {task.submesh} needs a group of {shape}, which no Ray node set fits "
            f"(nodes: {self.layout.describe()})"
        )
        return self._failure_result(task, ProfileStatus.runtime_error, why)


def _outcome(ref: ObjectRef) -> object:
    """A finished ref's value, or the exception it raised."""
    try:
        return ray.get(ref)
    except Exception as err:
        return err
