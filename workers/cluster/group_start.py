"""Starting measuring groups: Ray places their placement groups, each bundle gets one
process, and the processes of a group join their `jax.distributed` group. Every wait calls
`check` a few times a second, so a cancel or a shutdown interrupts a start.

Sharing the cluster with other runners (docs/sharing-a-cluster.md): a group is one placement
group, so Ray reserves all of its hosts or none. A runner that holds no group waits for its
first one at most `PoolConfig.device_wait_s`, saying so after `WAIT_NOTICE_S`; a runner that
holds groups takes only those placed within `PLACEMENT_EXTRA_WAIT_S` and never waits longer,
so no two runners each hold part of what both wait for; and a runner that holds nothing asks
for devices only once the requests other runners made before it are served (no starving).

A start watches its ranks: the moment one dies while joining, the group's other ranks are
killed (they would wait in `jax.distributed.initialize` until `JOIN_TIMEOUT_S`), and the
group is started once more with fresh processes on the same placement group.
"""

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray import ObjectRef
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)

from workers.cluster.host_group import MeasuringGroup
from workers.cluster.placement import GroupShape, Layout

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
POLL_S = 0.25
# Once one placement group of a shape is placed, how long the others may take (resources
# another runner holds are not waited for: the shape runs with the groups that were placed).
PLACEMENT_EXTRA_WAIT_S = 5.0
# How long a runner waits for its first group before it says it waits for another job.
WAIT_NOTICE_S = 2.0
# Names of measuring groups' placement groups: `<prefix><starter>:<group>`.
PG_PREFIX = "stageprof:"
# How often a group whose rank died while joining is started again with fresh processes.
JOIN_RETRIES = 1

# Told when a wait for devices begins (`shape`, None) and when it ends (`shape`, seconds).
WaitListener = Callable[[GroupShape, float | None], None]


@dataclass
class _Wait:
    """One wait for devices: for a group of `shape`, since `began`."""

    shape: GroupShape
    holding: bool
    began: float = field(default_factory=time.monotonic)
    noticed: bool = False

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.began

    def deadline(self, device_wait_s: float) -> float:
        return self.began + (PLACEMENT_EXTRA_WAIT_S if self.holding else device_wait_s)


class DevicesBusy(TimeoutError):
    """No group of a shape was placed within the wait bound: another job holds the devices."""


class GroupStarter:
    """Starts groups on `layout`'s nodes; counts the processes it started."""

    def __init__(
        self,
        layout: Layout,
        check: Callable[[], None],
        *,
        device_wait_s: float = START_TIMEOUT_S,
        on_wait: WaitListener | None = None,
    ) -> None:
        self.layout = layout
        self.check = check
        self.device_wait_s = device_wait_s
        self.on_wait = on_wait
        self.processes_started = 0
        self._name = f"{PG_PREFIX}{uuid.uuid4().hex[:12]}:"  # this starter's groups
        self.failed_joins = 0  # groups whose rank died while joining

    def new_groups(
        self, shape: GroupShape, count: int, holding: bool = False
    ) -> list[MeasuringGroup]:
        """Up to `count` started groups of `shape` (those Ray places in time). `holding`: the
        caller holds groups already, so it waits only `PLACEMENT_EXTRA_WAIT_S` and may get
        none."""
        if holding and self._waiters_ahead():
            return []  # a holder takes nothing another runner waits for
        wait = _Wait(shape, holding)
        if not holding:
            self._let_waiters_go_first(wait)
        strategy = "STRICT_SPREAD" if shape.processes > 1 else "PACK"
        bundles = [self.layout.bundle(shape) for _ in range(shape.processes)]
        pgs = [
            placement_group(bundles, strategy=strategy, name=f"{self._name}{uuid.uuid4().hex[:8]}")
            for _ in range(count)
        ]
        placed = self._placed(pgs, wait)
        if not placed:
            return []
        return self.start([MeasuringGroup(shape, pg) for pg in placed])

    def start(self, groups: list[MeasuringGroup]) -> list[MeasuringGroup]:
        """Spawn the groups' processes and let each group join; returns those that did (a
        group whose rank died while joining is tried `JOIN_RETRIES` more times, then killed
        and its placement group removed). On an error (a cancel) every group is removed."""
        failed = groups
        try:
            for _ in range(1 + JOIN_RETRIES):
                failed = self._start_once(failed)
                if not failed:
                    break
        except BaseException:
            for group in groups:
                group.kill()
                remove_placement_group(group.pg)
            raise
        lost = {id(g) for g in failed}
        for group in failed:
            remove_placement_group(group.pg)
        started = [g for g in groups if id(g) not in lost]
        if not started:
            raise RuntimeError(f"no group of {groups[0].shape} started")
        return started

    def _start_once(self, groups: list[MeasuringGroup]) -> list[MeasuringGroup]:
        """Spawn and join `groups`; returns those that failed (their processes killed)."""
        addresses = [g.spawn(self.layout) for g in groups]
        self.processes_started += sum(len(g.actors) for g in groups)
        coordinators = [None if ref is None else self._answer(ref) for ref in addresses]
        failed: set[int] = set()
        joins: dict[int, list[Any]] = {}
        for i, (group, coordinator) in enumerate(zip(groups, coordinators, strict=True)):
            if coordinator is None and group.shape.processes > 1:
                self._fail(group, "its first process did not start")
                failed.add(i)
            else:
                joins[i] = group.join(coordinator)
        group_of = {r.hex(): i for i, refs in joins.items() for r in refs}
        deadline = time.monotonic() + START_TIMEOUT_S
        pending = [r for refs in joins.values() for r in refs]
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            for ref in done:
                i = group_of[ref.hex()]
                if i in failed:
                    continue
                try:
                    ray.get(ref)
                except Exception as err:  # a rank died or failed while joining
                    self._fail(groups[i], str(err))
                    failed.add(i)
                    dropped = {r.hex() for r in joins[i]}
                    pending = [r for r in pending if r.hex() not in dropped]
            self.check()
            if pending and time.monotonic() > deadline:
                raise TimeoutError(
                    f"measuring processes did not join their group within {START_TIMEOUT_S:g} s"
                )
        for i, refs in joins.items():
            if i not in failed:
                groups[i].joined(ray.get(refs))
        return [groups[i] for i in sorted(failed)]

    def _fail(self, group: MeasuringGroup, why: str) -> None:
        """A group that did not join: its other ranks stop waiting now (killed)."""
        logger.warning("a group of %s did not start: %s", group.shape, why)
        self.failed_joins += 1
        group.kill()

    def wait(self, refs: list[ObjectRef], what: str) -> None:
        """Wait for `refs`, calling `check` meanwhile, at most `START_TIMEOUT_S`."""
        deadline = time.monotonic() + START_TIMEOUT_S
        pending = list(refs)
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            self.check()
            if pending and time.monotonic() > deadline:
                raise TimeoutError(
                    f"measuring processes did not {what} within {START_TIMEOUT_S:g} s"
                )

    def _answer(self, ref: ObjectRef) -> str | None:
        """Rank 0's coordinator address, or None when its process did not start (the
        group is then dropped)."""
        self.wait([ref], "start")
        try:
            return str(ray.get(ref))
        except Exception as err:
            logger.warning("a group's first process did not start: %s", err)
            return None

    def _waiters_ahead(self) -> set[str]:
        """Other runners' measuring groups that Ray has not placed yet."""
        return {
            pg_id
            for pg_id, t in placement_group_table().items()
            if t["state"] in ("PENDING", "RESCHEDULING")
            and t["name"].startswith(PG_PREFIX)
            and not t["name"].startswith(self._name)
        }

    def _let_waiters_go_first(self, wait: _Wait) -> None:
        """Ask for devices only once the groups other runners asked for earlier are placed
        (or given up): a runner that gives its groups back between shapes and jobs does not
        take them again ahead of a runner that waits for them."""
        ahead = self._waiters_ahead()
        while ahead and time.monotonic() < wait.deadline(self.device_wait_s):
            self.check()
            self._notice(wait)
            time.sleep(POLL_S)
            ahead &= self._waiters_ahead()

    def _notice(self, wait: _Wait) -> None:
        """Say the wait once it lasted `WAIT_NOTICE_S` (a holder's short wait is not one)."""
        if not wait.holding and not wait.noticed and wait.seconds >= WAIT_NOTICE_S:
            wait.noticed = True
            self._tell(wait.shape, None)

    def _placed(self, pgs: list[PlacementGroup], wait: _Wait) -> list[PlacementGroup]:
        """The placement groups Ray places: all, or those placed within
        `PLACEMENT_EXTRA_WAIT_S` of the first (the first within `device_wait_s` of the
        wait's start, or `PLACEMENT_EXTRA_WAIT_S` for a holder); the rest are removed.
        Raises `DevicesBusy` when none was placed in `device_wait_s`."""
        ready_refs = [pg.ready() for pg in pgs]
        by_ref = {r.hex(): pg for r, pg in zip(ready_refs, pgs, strict=True)}
        pending = list(ready_refs)
        placed: list[PlacementGroup] = []
        deadline = wait.deadline(self.device_wait_s)
        waited = 0.0
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
                if ready and not placed:
                    waited = wait.seconds  # the wait ends with the first group placed
                placed.extend(by_ref[r.hex()] for r in ready)
                self.check()
                now = time.monotonic()
                if placed and deadline > now + PLACEMENT_EXTRA_WAIT_S:
                    deadline = now + PLACEMENT_EXTRA_WAIT_S
                if not placed:
                    self._notice(wait)
                if pending and now > deadline:
                    break
        finally:
            placed_ids = {pg.id.hex() for pg in placed}
            for pg in pgs:
                if pg.id.hex() not in placed_ids:
                    remove_placement_group(pg)
        if wait.holding:
            return placed
        self._tell(wait.shape, waited if placed else wait.seconds)
        if not placed:
            raise DevicesBusy(
                f"Ray placed no group of {wait.shape} within {self.device_wait_s:g} s: the devices "
                f"are held by another job (nodes: {self.layout.describe()})"
            )
        return placed

    def _tell(self, shape: GroupShape, waited: float | None) -> None:
        if waited is None:
            logger.warning("waiting for devices held by another job (a group of %s)", shape)
        else:
            logger.info("devices for a group of %s after %.1f s", shape, waited)
        if self.on_wait is not None:
            self.on_wait(shape, waited)
