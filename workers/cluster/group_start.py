"""Starting measuring groups: Ray places their placement groups, each bundle gets one
process, and the processes of a group join their `jax.distributed` group. Every wait calls
`check` a few times a second, so a cancel or a shutdown interrupts a start."""

import logging
import time
from collections.abc import Callable

import ray
from ray import ObjectRef
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from workers.cluster.host_group import MeasuringGroup
from workers.cluster.placement import GroupShape, Layout

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
POLL_S = 0.25
# Once one placement group of a shape is placed, how long the others may take (resources
# another runner holds are not waited for: the shape runs with the groups that were placed).
PLACEMENT_EXTRA_WAIT_S = 5.0


class GroupStarter:
    """Starts groups on `layout`'s nodes; counts the processes it started."""

    def __init__(self, layout: Layout, check: Callable[[], None]) -> None:
        self.layout = layout
        self.check = check
        self.processes_started = 0

    def new_groups(self, shape: GroupShape, count: int) -> list[MeasuringGroup]:
        """Up to `count` started groups of `shape` (those Ray places in time)."""
        strategy = "STRICT_SPREAD" if shape.processes > 1 else "PACK"
        bundles = [self.layout.bundle(shape) for _ in range(shape.processes)]
        pgs = [placement_group(bundles, strategy=strategy) for _ in range(count)]
        return self.start([MeasuringGroup(shape, pg) for pg in self._placed(pgs, shape)])

    def start(self, groups: list[MeasuringGroup]) -> list[MeasuringGroup]:
        """Spawn the groups' processes and let each group join; returns those that did (the
        others are killed and their placement groups removed)."""
        addresses = [g.spawn(self.layout) for g in groups]
        self.processes_started += sum(len(g.actors) for g in groups)
        coordinators = [None if ref is None else self._answer(ref) for ref in addresses]
        joins = [g.join(c) for g, c in zip(groups, coordinators, strict=True)]
        self.wait([r for refs in joins for r in refs], "join its group")
        started = []
        for group, refs in zip(groups, joins, strict=True):
            try:
                group.joined(ray.get(refs))
                started.append(group)
            except Exception as err:  # a process that died while joining
                logger.warning("a group of %s did not start: %s", group.shape, err)
                group.kill()
                remove_placement_group(group.pg)
        if not started:
            raise RuntimeError(f"no group of {groups[0].shape} started")
        return started

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
        group's join then fails and the group is dropped)."""
        self.wait([ref], "start")
        try:
            return str(ray.get(ref))
        except Exception as err:
            logger.warning("a group's first process did not start: %s", err)
            return None

    def _placed(self, pgs: list[PlacementGroup], shape: GroupShape) -> list[PlacementGroup]:
        """The placement groups Ray places: all, or those placed within
        `PLACEMENT_EXTRA_WAIT_S` of the first; the rest are removed."""
        ready_refs = [pg.ready() for pg in pgs]
        by_ref = {r.hex(): pg for r, pg in zip(ready_refs, pgs, strict=True)}
        pending = list(ready_refs)
        placed: list[PlacementGroup] = []
        deadline = time.monotonic() + START_TIMEOUT_S
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            placed.extend(by_ref[r.hex()] for r in ready)
            self.check()
            now = time.monotonic()
            if placed and deadline > now + PLACEMENT_EXTRA_WAIT_S:
                deadline = now + PLACEMENT_EXTRA_WAIT_S
            if pending and now > deadline:
                break
        placed_ids = {pg.id.hex() for pg in placed}
        for pg in pgs:
            if pg.id.hex() not in placed_ids:
                remove_placement_group(pg)
        if not placed:
            raise TimeoutError(
                f"Ray placed no group of {shape} within {START_TIMEOUT_S:g} s "
                f"(nodes: {self.layout.describe()})"
            )
        return placed
