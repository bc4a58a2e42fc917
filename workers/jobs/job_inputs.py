"""A job's inputs: its model (a zoo model is built here), cluster and options, and its
candidate space, refused when over the candidate cap before anything is enumerated
(`load_checked`: all of them, checked)."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

import planner
import store
from schemas import ClusterSpec, ModelSpec, PlanOptions
from schemas.candidate_count import count_candidates
from schemas.limits import max_candidates
from workers.jobs.heartbeat import LeaseKeeper
from workers.jobs.retry import StoreRetry

ZooBuilder = Callable[[str, dict[str, Any]], ModelSpec]


class JobFailed(Exception):
    """The job cannot produce a plan; the message says why."""


@dataclass(frozen=True)
class ZooBuilders:
    """How a runner builds zoo models: as traced (`plain`), and with a symbolic batch
    dimension for a job that searches counts of micro-batches (`symbolic`)."""

    plain: ZooBuilder | None = None
    symbolic: ZooBuilder | None = None


def load_job(
    retry: StoreRetry, keeper: LeaseKeeper, job_id: str, builders: ZooBuilders
) -> tuple[str, ModelSpec, ClusterSpec, PlanOptions]:
    """The job's model (a zoo model is built and stored here: with a symbolic batch
    dimension when the job searches counts of micro-batches), cluster and options."""

    def read(
        s: Session,
    ) -> tuple[str | None, ModelSpec | None, ClusterSpec, PlanOptions, str, dict[str, Any]]:
        row = store.get_job(s, job_id=job_id)
        assert row is not None
        cluster = ClusterSpec.model_validate(row.cluster)
        options = PlanOptions.model_validate(row.options)
        if row.model_id is None:
            return None, None, cluster, options, row.zoo_name or "", dict(row.zoo_config or {})
        try:
            spec = store.get_model_spec(s, model_id=row.model_id)
        except store.OldModelForm as err:
            raise JobFailed(str(err)) from err
        if spec is None:
            raise JobFailed(f"model {row.model_id} is not stored")
        return row.model_id, spec, cluster, options, "", {}

    model_id, spec, cluster, options, zoo_name, zoo_config = retry.patient(
        "load job", read, write=False
    )
    if spec is not None:
        assert model_id is not None  # a stored model's spec
        return model_id, spec, cluster, options
    searched = options.microbatch_search is not None
    build_zoo = builders.symbolic if searched else builders.plain
    if build_zoo is None:
        how = " with a symbolic batch dimension (microbatch_search)" if searched else ""
        raise JobFailed(f"this runner cannot build zoo models{how}")
    try:
        spec = keeper.call("zoo build", build_zoo, zoo_name, zoo_config)
    except (ValueError, TypeError, KeyError) as err:
        raise JobFailed(f"zoo model {zoo_name!r}: {err}") from err

    def save(s: Session) -> str:
        model, _ = store.put_model(s, spec=spec)
        store.set_job_model(s, job_id=job_id, model_id=model.id)
        return model.id

    return retry.patient("store zoo model", save), spec, cluster, options


def enumerate_space(
    spec: ModelSpec, cluster: ClusterSpec, options: PlanOptions, keeper: LeaseKeeper
) -> planner.CandidateSpace:
    """The candidate space, refused when over `STAGEPROF_MAX_CANDIDATES` (counted in
    closed form first: a huge model is never enumerated)."""
    cap = max_candidates()
    count = count_candidates(
        spec.num_layers,
        cluster,
        options,
        spec.micro_batch_size,
        [x.flops for x in spec.layers],
        len(planner.remat_choices(spec, options.remat)),
        spec.mesh_facts,
    )
    if count.total > cap:
        raise JobFailed(
            f"{count.total} stage candidates, over the cap of {cap} (STAGEPROF_MAX_CANDIDATES)"
        )
    space = keeper.call("enumeration", planner.enumerate_candidates, spec, cluster, options)
    if len(space.keys) > cap:
        raise JobFailed(
            f"{len(space.keys)} stage candidates, over the cap of {cap} (STAGEPROF_MAX_CANDIDATES)"
        )
    return space


@dataclass(frozen=True)
class JobInputs:
    """A loaded job, checked: its model, cluster and options and its candidate space (with
    the layer profiles the estimate search needs: `planner.with_layer_profiles`); in a job
    that searches counts of micro-batches, one count's: the spec stated at its micro-batch
    size (`micro_batch_size`, 0 in a job of one count) and the options at that count."""

    model_id: str
    spec: ModelSpec
    cluster: ClusterSpec
    options: PlanOptions
    space: planner.CandidateSpace
    # estimate search: stages on every device estimated by scaling (the whole model, and the
    # layers outside the pipeline), and the whole-model stages measured directly
    scaled: frozenset[tuple[int, int, int, int]] = frozenset()
    direct: tuple[tuple[int, int, int, int], ...] = ()
    micro_batch_size: int = 0

    @property
    def model_key(self) -> str:
        """The spec's key in the measuring pool (and in its actors' spec cache)."""
        if not self.micro_batch_size:
            return self.model_id
        return f"{self.model_id}@{self.micro_batch_size}"


def load_checked(
    retry: StoreRetry, keeper: LeaseKeeper, job_id: str, builders: ZooBuilders
) -> list[JobInputs]:
    """The job's inputs, one per count of micro-batches it plans (`microbatch_search`: the
    spec stated at each count's micro-batch size, `programs.spec_at_batch`), refused
    (`JobFailed`) when its batch disagrees with its spec, its programs do not match the
    spec, a count's size cannot be stated, or a space is over the candidate cap."""
    from programs import spec_at_batch
    from workers.measure import check_programs

    model_id, spec, cluster, options = load_job(retry, keeper, job_id, builders)
    traced = spec.micro_batch_size
    searched = options.microbatch_search is not None
    try:
        options.check_micro_batch(traced)
        options.microbatch_counts(traced)  # raises for a count that does not divide
    except ValueError as err:
        field = "microbatch_search" if searched else "global_batch_size"
        raise JobFailed(f"options.{field}: {err}") from err
    if searched and options.search_mode != "estimate":
        raise JobFailed(
            "options.microbatch_search: counts of micro-batches are searched by the estimate "
            f"search (search: estimate), not {options.search_mode}"
        )
    problems = keeper.call("program check", check_programs, spec)
    if problems:
        raise JobFailed("the model's programs do not match its spec: " + "; ".join(problems))
    if not searched:
        return [_count_inputs(keeper, model_id, spec, cluster, options, 0)]
    try:  # the variants the job measures under: only they are stated at each size
        variants = planner.remat_choices(spec, options.remat)
    except ValueError as err:
        raise JobFailed(f"options.remat: {err}") from err
    out = []
    for count, size in options.count_sizes(traced):
        try:
            at_size = keeper.call("spec at size", spec_at_batch, spec, size, variants)
        except ValueError as err:
            raise JobFailed(
                f"options.microbatch_search: {count} micro-batches of {size}: {err}"
            ) from err
        at_count = options.at_count(count, traced)
        out.append(_count_inputs(keeper, model_id, at_size, cluster, at_count, size))
    return out


def _count_inputs(
    keeper: LeaseKeeper,
    model_id: str,
    spec: ModelSpec,
    cluster: ClusterSpec,
    options: PlanOptions,
    micro_batch_size: int,
) -> JobInputs:
    """One count's inputs: its space enumerated (within the cap), with layer profiles."""
    space = enumerate_space(spec, cluster, options, keeper)
    scaled: list[tuple[int, int, int, int]] = []
    direct: list[tuple[int, int, int, int]] = []
    if options.search_mode == "estimate":
        fps = [x.fingerprint for x in spec.layers]
        space, scaled, direct = planner.with_layer_profiles(space, fps)
    if options.allows_outside:  # after the layer profiles: they decide on the whole cluster
        before = {k.as_tuple() for k in space.keys}
        space = planner.with_layers_outside(space, spec, cluster.num_devices)
        if options.search_mode == "estimate":
            # searched at their scaled estimate, measured when a plan within the band holds one
            scaled += [k.as_tuple() for k in space.keys if k.as_tuple() not in before]
    return JobInputs(
        model_id,
        spec,
        cluster,
        options,
        space,
        frozenset(scaled),
        tuple(direct),
        micro_batch_size,
    )
