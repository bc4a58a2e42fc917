"""Hand-made models (with real exported programs), profiles and finished jobs for the
server tests."""

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from sqlalchemy.orm import Session, sessionmaker

from client.export import LayerPrograms, export_layer_pair
from planner.schedule import simulate_1f1b
from programs import layer_fingerprint
from schemas import (
    BaselinePlan,
    ClusterSpec,
    JobStatus,
    LayerSpec,
    ModelSpec,
    ParamSpec,
    Plan,
    PlannedStage,
    PlanOptions,
    ProfileStatus,
    RunnerUpPlan,
    ShardingConfig,
    StageKey,
    StageProfileResult,
    SubmeshShape,
    VarSpec,
)
from store import (
    CandidateIn,
    add_candidates,
    claim_job,
    create_job,
    finish_job,
    mark_estimated,
    mark_pruned,
    put_model,
    record_estimates,
    record_result,
    refresh_progress,
    save_profile,
    session_scope,
    set_job_phase,
)
from tests.support.estimates import ESTIMATE_ERROR, with_search
from tests.support.profiles import fake_profile

# (submesh (hosts, devices), [(logical mesh, strategy), ...]) for a 1 x 2 cluster.
SPACE = [
    ((1, 1), [((1, 1), "data")]),
    ((1, 2), [((2, 1), "data"), ((1, 2), "megatron")]),
]


@functools.cache
def _dense_programs(i: int, last: bool, width: int, batch: int) -> LayerPrograms:
    """Real `jax.export` programs of `tanh(x @ w) * (i + 1)` (summed when `last`): the scale
    makes every layer's programs, and so its fingerprint, distinct."""
    x = VarSpec(name="x", shape=(batch, width), dtype="float32")
    out = VarSpec(name="y", shape=() if last else (batch, width), dtype="float32")
    w = ParamSpec(name="w", shape=(width, width), dtype="float32")

    def fn(w_: jax.Array, x_: jax.Array) -> tuple[jax.Array]:
        y = jnp.tanh(x_ @ w_) * (i + 1)
        return (jnp.sum(y) if last else y,)

    return export_layer_pair(fn, [w], [x], [out], no_grad={"x"} if i == 0 else ())


def exported_chain_spec(
    num_layers: int = 6, width: int = 8, name: str = "chain", batch: int = 4
) -> ModelSpec:
    """x -> h0 -> ... -> loss: dense layers with distinct programs and fingerprints, then a
    scalar loss; fingerprints are the ones the service computes."""
    layers = []
    prev = VarSpec(name="x", shape=(batch, width), dtype="float32")
    for i in range(num_layers):
        last = i == num_layers - 1
        out = VarSpec(
            name="loss" if last else f"h{i}",
            shape=() if last else (batch, width),
            dtype="float32",
        )
        pair = _dense_programs(i, last, width, batch)
        saved, grad_inputs = pair.names([prev], [out])
        layer = LayerSpec(
            name=f"{name}_layer{i}",
            inputs=[prev],
            outputs=[out],
            params=[ParamSpec(name=f"w{i}", shape=(width, width), dtype="float32")],
            forward=pair.forward,
            backward=pair.backward,
            residuals=pair.residuals,
            saved=saved,
            grad_inputs=grad_inputs,
            jaxpr=f"{{ lambda ; a:f32[{width},{width}] b:f32[{batch},{width}]. "
            f"let c = dot_general b a in (c,) }}  # layer {i}",
            flops=2.0 * batch * width * width,
        )
        layers.append(layer.model_copy(update={"fingerprint": layer_fingerprint(layer)}))
        prev = out
    x = VarSpec(name="x", shape=(batch, width), dtype="float32")
    return ModelSpec(name=name, inputs=[x], layers=layers, loss="loss")


def stage_profile(
    fingerprint: str,
    key: StageKey,
    submesh: tuple[int, int],
    mesh: tuple[int, int],
    strategy: str,
    cost: float,
    status: ProfileStatus = ProfileStatus.ok,
    peak_memory: int = 1000,
) -> StageProfileResult:
    """Candidate `key` measured at `cost` (a third forward, two thirds backward)."""
    return fake_profile(
        fingerprint,
        status,
        forward=cost * (1 / 3),
        backward=cost * (2 / 3),
        error=f"{status.value}: <b>not</b> measured",
        key=key,
        submesh=SubmeshShape(hosts=submesh[0], devices_per_host=submesh[1]),
        config=ShardingConfig(logical_mesh=mesh, strategy=strategy),  # type: ignore[arg-type]
        num_layers=key.end - key.start + 1,
        peak=peak_memory,
        temp=10,
        with_vars=True,
    )


def candidate_cost(start: int, end: int, submesh_id: int, config_id: int) -> float:
    """A made-up stage time: per-layer cost over devices, megatron slightly slower."""
    devices = SPACE[submesh_id][0][1]
    return 0.004 * (end - start + 1) / devices * (1.25 if config_id == 1 else 1.0) + 1e-4 * start


def failed_key(start: int, end: int, submesh_id: int, config_id: int, num_layers: int) -> bool:
    """Which candidates fail: the whole model on one device (oom), one megatron compile."""
    if (start, end, submesh_id) == (0, num_layers - 1, 0):
        return True
    return (start, end, submesh_id, config_id) == (1, 2, 1, 1)


@dataclass(frozen=True)
class SeededJob:
    job_id: str
    model_id: str
    num_layers: int
    num_candidates: int
    plan: Plan | None


def _keys(num_layers: int) -> list[tuple[int, int, int, int]]:
    return [
        (s, e, m, c)
        for s in range(num_layers)
        for e in range(s, num_layers)
        for m, (_, configs) in enumerate(SPACE)
        for c in range(len(configs))
    ]


def _fingerprint(salt: str, key: tuple[int, int, int, int]) -> str:
    return f"{salt}-{key[0]}-{key[1]}-{key[2]}-{key[3]}"


def _planned(start: int, end: int, salt: str) -> PlannedStage:
    """Layers start..end on one device (submesh 0, config 0), as the profiles measured them."""
    cost = candidate_cost(start, end, 0, 0)
    return PlannedStage(
        start=start,
        end=end,
        layer_names=[f"chain_layer{i}" for i in range(start, end + 1)],
        submesh_id=0,
        config_id=0,
        submesh=SubmeshShape(hosts=1, devices_per_host=1),
        config=ShardingConfig(logical_mesh=(1, 1), strategy="data"),
        forward_cost=cost / 3,
        backward_cost=2 * cost / 3,
        compute_cost=cost,
        peak_memory=1000,
        initial_var_size=400,
        intermediate_size=100,
        max_n_succ_stages=5,
        fingerprint=_fingerprint(salt, (start, end, 0, 0)),
    )


def _objective(stages: list[PlannedStage], num_microbatches: int) -> float:
    costs = [s.compute_cost for s in stages]
    return sum(costs) + (num_microbatches - 1) * max(costs)


def make_plan(num_layers: int, num_microbatches: int, salt: str) -> Plan:
    """Two stages (halves of the model) on one device each, with the 1F1B schedule; the
    runner-up is the cheapest other split that is not cheaper (the plan is then stable:
    its gap is above the spread), or there is none (unique)."""
    half = num_layers // 2
    stages = [_planned(0, half - 1, salt), _planned(half, num_layers - 1, salt)]
    schedule = simulate_1f1b(
        [s.forward_cost for s in stages], [s.backward_cost for s in stages], num_microbatches
    )
    dp_cost = _objective(stages, num_microbatches)
    splits = [
        (_objective(other, num_microbatches), other)
        for k in range(1, num_layers)
        if k != half
        for other in [[_planned(0, k - 1, salt), _planned(k, num_layers - 1, salt)]]
    ]
    runner_up = None
    if any(cost >= dp_cost for cost, _ in splits):
        other_cost, other = min((c, o) for c, o in splits if c >= dp_cost)
        other_schedule = simulate_1f1b(
            [s.forward_cost for s in other], [s.backward_cost for s in other], num_microbatches
        )
        runner_up = RunnerUpPlan(
            dp_cost_s=other_cost,
            gap=(other_cost - dp_cost) / dp_cost,
            cost_spread=0.018,
            predicted_iteration_time_s=other_schedule.iteration_time_s,
            stages=other,
        )
    whole = candidate_cost(0, num_layers - 1, 1, 0)
    return Plan(
        stages=stages,
        num_microbatches=num_microbatches,
        num_layers=num_layers,
        num_devices=2,
        dp_cost_s=dp_cost,
        predicted_iteration_time_s=schedule.iteration_time_s,
        bubble_fraction=schedule.bubble_fraction,
        dp_wall_seconds=0.0021,
        baselines=[
            BaselinePlan(name="data_parallel", iteration_time_s=1.5 * whole * num_microbatches),
            BaselinePlan(name="uniform_3", reason="3 stages do not fit 2 devices"),
        ],
        schedule=schedule.events,
        cost_spread=0.021,
        runner_up=runner_up,
        stability="stable" if runner_up else "unique",
        runner_up_wall_seconds=0.0013,
    )


def estimated_keys(num_layers: int, plan: Plan | None) -> set[tuple[int, int, int, int]]:
    """What `seed_job(estimated=True)` never measures: the stages `with_search` marks
    estimated (the runner-up's last, the whole model on two devices) and every other stage
    of three layers or more on one device that is in neither the plan nor the runner-up
    and does not fail."""
    never = {(0, num_layers - 1, 1, 0)}
    keep: set[tuple[int, int, int, int]] = set()
    if plan is not None:
        keep = {_stage_key(st) for st in plan.stages}
        if plan.runner_up is not None:
            keep |= {_stage_key(st) for st in plan.runner_up.stages[:-1]}
            never.add(_stage_key(plan.runner_up.stages[-1]))
    return never | {
        k
        for k in _keys(num_layers)
        if k[2:] == (0, 0) and k[1] - k[0] >= 2 and k not in keep and not failed_key(*k, num_layers)
    }


def _stage_key(st: PlannedStage) -> tuple[int, int, int, int]:
    return (st.start, st.end, st.submesh_id, st.config_id)


def seed_job(
    factory: sessionmaker[Session],
    *,
    num_layers: int = 6,
    num_microbatches: int = 4,
    finished: bool = True,
    recorded_fraction: float = 1.0,
    salt: str = "fp",
    name: str = "chain",
    pruned: int = 0,
    estimated: bool = False,
    phase: str | None = None,
) -> SeededJob:
    """A job of a `exported_chain_spec` model on a 1x2 cluster with every candidate added.

    `finished`: every candidate recorded (some failed) and a plan stored (status done).
    Otherwise the job is profiling with the first `recorded_fraction` of candidates recorded
    and the last `pruned` candidates pruned, in `phase` (e.g. "verification round 2").
    `estimated`: as an estimate search, the stages `estimated_keys` names are never measured
    but estimated, every candidate has an estimate 5% above its made-up cost, and the plan
    is `with_search`'s.
    """
    keys = _keys(num_layers)
    plan = make_plan(num_layers, num_microbatches, salt) if finished else None
    never = estimated_keys(num_layers, plan) if estimated else set()
    with session_scope(factory) as s:
        model, _ = put_model(s, spec=exported_chain_spec(num_layers, name=name))
        options = PlanOptions(num_microbatches=num_microbatches, strategies=["data", "megatron"])
        job = create_job(
            s,
            cluster=ClusterSpec(num_hosts=1, devices_per_host=2),
            options=options,
            model_id=model.id,
        )
        claim_job(s, owner="test-runner", lease_seconds=600, job_id=job.id)
        add_candidates(
            s,
            job_id=job.id,
            model_id=model.id,
            candidates=[
                CandidateIn(
                    key=StageKey(start=k[0], end=k[1], submesh_id=k[2], config_id=k[3]),
                    fingerprint=_fingerprint(salt, k),
                    num_devices=SPACE[k[2]][0][1],
                    strategy=SPACE[k[2]][1][k[3]][1],
                )
                for k in keys
            ],
        )
        n_record = len(keys) if finished else int(len(keys) * recorded_fraction)
        for k in keys[:n_record]:
            if k in never:
                continue
            submesh, configs = SPACE[k[2]]
            mesh, strategy = configs[k[3]]
            failed = failed_key(*k, num_layers)
            status = ProfileStatus.ok
            if failed:
                status = ProfileStatus.oom if k[2] == 0 else ProfileStatus.compile_error
            result = stage_profile(
                _fingerprint(salt, k),
                StageKey(start=k[0], end=k[1], submesh_id=k[2], config_id=k[3]),
                submesh,
                mesh,
                strategy,
                candidate_cost(*k),
                status,
                peak_memory=1000 * (k[1] - k[0] + 1) // submesh[1],
            )
            row = save_profile(s, result=result)
            record_result(s, job_id=job.id, profile=row, reused=k[0] % 2 == 1)
        if pruned:
            fps = [_fingerprint(salt, k) for k in keys[n_record:][-pruned:]]
            mark_pruned(s, job_id=job.id, fingerprints=fps)
        if estimated:
            guesses = {
                _fingerprint(salt, k): candidate_cost(*k) * (1 + ESTIMATE_ERROR) for k in keys
            }
            record_estimates(s, job_id=job.id, estimates=guesses)
            mark_estimated(s, job_id=job.id, fingerprints=[_fingerprint(salt, k) for k in never])
        if phase is not None:
            set_job_phase(s, job_id=job.id, owner="test-runner", phase=phase)
        refresh_progress(s, job_id=job.id)
        if plan is not None:
            plan = with_search(plan) if estimated else plan
            finish_job(s, job_id=job.id, owner="test-runner", status=JobStatus.done, plan=plan)
        return SeededJob(job.id, model.id, num_layers, len(keys), plan)
