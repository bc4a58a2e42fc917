"""Measuring groups on a real two-node Ray cluster: a 2-host submesh runs as one SPMD
program over two processes on distinct nodes (gloo CPU collectives), groups are respawned
per shape and packed, and a dead rank loses only its candidate."""

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.util.placement_group import placement_group_table, remove_placement_group

from planner import enumerate_candidates
from schemas import ModelSpec, ProfileStatus, StageKey
from tests.multihost.cluster import (
    CLUSTER,
    OPTIONS,
    alive,
    held_rank,
    hold_the_cluster,
    live_groups,
    rank0_of,
    wait_all_removed,
)
from tests.support.models import tiny_gpt
from tests.support.waiting import wait_until
from workers.cluster.group_start import WAIT_NOTICE_S
from workers.cluster.host_group import HOLD_JOIN_ENV
from workers.cluster.placement import GroupShape
from workers.cluster.pool import CandidateRetry, CandidateTask, GroupPool, PoolConfig
from workers.measure.stage import measure_stage

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("two_nodes")]


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return tiny_gpt(num_layers=2)


def _keys(spec: ModelSpec, hosts: int, devices: int) -> list[tuple[StageKey, Any]]:
    space = enumerate_candidates(spec, CLUSTER, OPTIONS)
    return [
        (k, space.submeshes[k.submesh_id])
        for k in space.keys
        if space.submeshes[k.submesh_id].as_tuple() == (hosts, devices)
    ]


def _failure(task: CandidateTask, status: ProfileStatus, error: str) -> Any:
    return (status, error)


def _pool(spec: ModelSpec, retry: CandidateRetry | None = None) -> GroupPool:
    return GroupPool(
        PoolConfig(),
        model_key="m",
        spec=spec,
        cluster=CLUSTER,
        options=OPTIONS,
        failure_result=_failure,
        retry=retry,
    )


def _result(pool: GroupPool, timeout_s: float = 240) -> Any:
    results = wait_until(lambda: pool.poll(1.0), timeout_s, "a result", interval_s=0)
    assert len(results) == 1
    return results[0]


def test_a_two_host_candidate_runs_on_two_nodes_and_equals_one_process(spec: ModelSpec) -> None:
    key, submesh = _keys(spec, 2, 2)[0]
    pool = _pool(spec)
    try:
        pool.submit(CandidateTask("fp", key, submesh))
        (group,) = pool.groups
        assert group.shape == GroupShape(2, 2)
        assert group.info is not None and group.info["num_devices"] == 4
        assert group.info["local_devices"] == 2
        table = placement_group_table(group.pg)
        assert table["strategy"] == "STRICT_SPREAD"
        assert len(set(table["bundles_to_node_id"].values())) == 2
        result = _result(pool)
    finally:
        pool.shutdown()
    assert result.status == ProfileStatus.ok, result.error
    nodes = {p.split(":")[0] for p in result.measured_by}
    assert len(result.measured_by) == 2 and len(nodes) == 2
    # The independent reference: the same stage in this one process, on 4 of its devices.
    alone = measure_stage(spec, key, CLUSTER, OPTIONS)
    assert alone.ok, alone.error
    assert result.flops == pytest.approx(alone.flops, rel=1e-6)
    assert result.initial_var_size == alone.initial_var_size
    assert result.intermediate_size == alone.intermediate_size
    assert result.peak_memory == alone.peak_memory
    for ours, ref in zip(result.module_profile_results, alone.module_profile_results, strict=True):
        assert ours.flops == pytest.approx(ref.flops, rel=1e-6)
        assert ours.collective_bytes == ref.collective_bytes
        assert ours.compute_cost > 0


def test_groups_are_respawned_per_shape_and_packed(spec: ModelSpec) -> None:
    (key2, mesh2), *_ = _keys(spec, 2, 2)
    ones = _keys(spec, 1, 1)
    pool = _pool(spec)
    try:
        pool.submit(CandidateTask("a", key2, mesh2))
        first = pool.actor_pids()
        assert _result(pool).status == ProfileStatus.ok
        key1, mesh1 = ones[0]
        assert pool.accepts(mesh1)  # idle: it turns to the new shape
        pool.submit(CandidateTask("b", key1, mesh1))
        # 2 nodes x 2 devices: four 1-device groups, none holding more than its device
        assert [g.shape for g in pool.groups] == [GroupShape(1, 1)] * 4
        assert all(g.info and g.info["num_devices"] == 1 for g in pool.groups)
        assert not any(alive(pid) for pid in first)
        assert len({g.processes[0].split(":")[0] for g in pool.groups}) == 2
        for key, mesh in ones[1:4]:
            assert pool.accepts(mesh)
            pool.submit(CandidateTask(str(key), key, mesh))
        assert not pool.accepts(mesh1)  # all four busy
        done: list[Any] = []

        def all_four_done() -> bool:
            done.extend(pool.poll(1.0))
            return len(done) >= 4

        wait_until(all_four_done, 240, "four results", interval_s=0)
        assert all(r.status == ProfileStatus.ok for r in done)
        assert len({r.measured_by for r in done}) == 4
        assert [str(s) for s in pool.shapes] == ["2 processes x 2", "1 process x 1"]
    finally:
        pool.shutdown()


def test_a_dead_rank_loses_its_candidate_and_the_group_goes_on(spec: ModelSpec) -> None:
    (key, mesh), *_ = _keys(spec, 2, 2)
    pool = _pool(spec, CandidateRetry(max_attempts=1))
    try:
        pool.submit(CandidateTask("x", key, mesh))
        before = pool.actor_pids()
        os.kill(before[1], 9)  # rank 1, on the second node
        lost = _result(pool)
        assert lost[0] == ProfileStatus.worker_lost, lost
        assert pool.actors_replaced == 2  # the whole group, not only the dead rank
        after = pool.actor_pids()
        assert not set(after) & set(before)
        assert not any(alive(pid) for pid in before)
        pool.submit(CandidateTask("y", key, mesh))
        result = _result(pool)
        assert result.status == ProfileStatus.ok, result.error
        assert {int(p.split(":")[1]) for p in result.measured_by} == set(after)
    finally:
        pool.shutdown()
    assert ray.is_initialized()


def test_ranks_time_out_together(spec: ModelSpec) -> None:
    """The deadline is agreed by both ranks: a candidate past its limit comes back as
    `timeout` from the group, neither rank left waiting in a collective for the other."""
    (key, mesh), *_ = _keys(spec, 2, 2)
    options = OPTIONS.model_copy(update={"candidate_timeout_s": 0.05})
    pool = GroupPool(
        PoolConfig(kill_grace_s=60.0),  # so the result is the ranks' own, not the pool's kill
        model_key="m",
        spec=spec,
        cluster=CLUSTER,
        options=options,
        failure_result=_failure,
    )
    try:
        pool.submit(CandidateTask("t", key, mesh))
        began = time.monotonic()
        result = _result(pool, timeout_s=90)
        assert result.status == ProfileStatus.timeout, result
        assert len(result.measured_by) == 2
        assert time.monotonic() - began < 30
        assert pool.actors_replaced == 0  # both ranks answered: the group lives on
    finally:
        pool.shutdown()


def test_a_wait_for_devices_another_job_holds_is_said_and_bounded(spec: ModelSpec) -> None:
    (key, mesh), *_ = _keys(spec, 2, 2)
    held = hold_the_cluster()
    told: list[Any] = []
    pool = GroupPool(
        PoolConfig(device_wait_s=WAIT_NOTICE_S + 2),
        model_key="m",
        spec=spec,
        cluster=CLUSTER,
        options=OPTIONS,
        failure_result=_failure,
        on_wait=lambda shape, waited: told.append((shape, waited)),
    )
    try:
        pool.submit(CandidateTask("w", key, mesh))
        status, error = _result(pool, timeout_s=30)
        assert status == ProfileStatus.runtime_error
        assert "held by another job" in error
        assert [t[1] for t in told][0] is None  # said while waiting
        assert told[-1][0] == GroupShape(2, 2) and told[-1][1] >= WAIT_NOTICE_S + 2
        assert pool.actors_started == 0
        assert [t["placement_group_id"] for t in live_groups()] == [held.id.hex()]
        # The job waited its bound for that shape: its other stages of the shape fail at once.
        waits = len(told)
        pool.submit(CandidateTask("w2", key, mesh))
        assert "held by another job" in _result(pool, timeout_s=1)[1]
        assert len(told) == waits
    finally:
        pool.shutdown()
        remove_placement_group(held)
    assert wait_all_removed()


def test_a_pool_asks_only_for_the_groups_it_can_use_and_gives_idle_ones_back(
    spec: ModelSpec,
) -> None:
    (key, mesh), *_ = _keys(spec, 1, 1)
    pool = _pool(spec)
    try:
        pool.submit(CandidateTask("one", key, mesh), wanted=1)
        assert len(pool.groups) == 1  # four fit, one is asked for
        assert len(live_groups()) == 1
        assert _result(pool).status == ProfileStatus.ok
        assert pool.release_idle() == 1
        assert not pool.groups
        assert wait_all_removed()
    finally:
        pool.shutdown()


def test_the_group_started_for_info_measures_while_the_others_start(spec: ModelSpec) -> None:
    """`info` starts one group; the first stage runs on it at once, and the pool grows to
    more groups only for the stages after it (the probe group used to idle while they
    started)."""
    (first, mesh), (second, _), *_ = _keys(spec, 1, 1)
    pool = _pool(spec)
    try:
        pool.info(mesh)
        (probe,) = pool.groups
        pool.submit(CandidateTask("first", first, mesh))
        assert [g is probe for g in pool.groups] == [True]  # nothing else started first
        assert probe.task is not None
        assert pool.accepts(mesh)  # more groups of its shape can still start
        pool.submit(CandidateTask("second", second, mesh))
        assert len(pool.groups) > 1
        assert sum(g.task is not None for g in pool.groups) == 2
        done: list[Any] = []

        def both() -> bool:
            done.extend(pool.poll(1.0))
            return len(done) == 2

        wait_until(both, 240, "two results", interval_s=0)
        assert [r.status for r in done] == [ProfileStatus.ok] * 2
    finally:
        pool.shutdown()


def test_a_rank_dying_while_joining_fails_its_group_within_seconds(
    spec: ModelSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 is held before `jax.distributed.initialize` (the `HOLD_JOIN_ENV` hook) while
    rank 0 waits in it; killing rank 1 ends rank 0 within seconds, and the group is started
    afresh on its placement group, which measures the candidate."""
    monkeypatch.setenv(HOLD_JOIN_ENV, str(tmp_path))
    (key, mesh), *_ = _keys(spec, 2, 2)
    pool = _pool(spec)
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(pool.submit(CandidateTask("j", key, mesh))))
    try:
        thread.start()
        port, pid = held_rank(tmp_path)
        peer = rank0_of(tmp_path, port)
        os.kill(pid, 9)
        killed = time.monotonic()
        while alive(peer):
            assert time.monotonic() - killed < 10, "rank 0 still waits in its group's join"
            time.sleep(0.1)
        thread.join(timeout=120)
        assert not thread.is_alive() and box == [None]
        assert pool._starter.failed_joins == 1
        (group,) = pool.groups
        assert peer not in group.pids and pid not in group.pids
        result = _result(pool)
        assert result.status == ProfileStatus.ok, result.error
    finally:
        thread.join(timeout=120)
        pool.shutdown()
