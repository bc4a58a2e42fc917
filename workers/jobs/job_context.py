"""One job's context: what every phase of a job reads, built once when the job is loaded and
frozen from then on: one object through every phase instead of its parts one by one (as
Ray Train v2's execution code carries its `TrainRunContext`,
ray/train/v2/_internal/execution/context.py)."""

import hashlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import planner
import store
from schemas import ClusterSpec, ModelSpec, PlanOptions, StageKey
from workers.cluster import Layout
from workers.jobs.heartbeat import LeaseKeeper
from workers.jobs.job_stats import JobStats
from workers.jobs.phase import MeasuringPhase, ResultSink
from workers.jobs.retry import StoreRetry
from workers.jobs.stage_ledger import StageLedger
from workers.jobs.stage_order import by_group_shape

Key = tuple[int, int, int, int]
# The stage fingerprint of a candidate key (with the backward split: True).
FingerprintOf = Callable[[StageKey, bool | None], str]


@dataclass(frozen=True)
class JobCandidates:
    """A job's candidates with their stage fingerprints (equal fingerprint: one
    measurement, shared by every key that has it)."""

    rows: tuple[store.CandidateIn, ...]
    fingerprint_of: FingerprintOf
    keys_by_fp: dict[str, list[StageKey]] = field(init=False)
    fp_of: dict[Key, str] = field(init=False)

    def __post_init__(self) -> None:
        keys_by_fp: dict[str, list[StageKey]] = {}
        for c in self.rows:
            keys_by_fp.setdefault(c.fingerprint, []).append(c.key)
        object.__setattr__(self, "keys_by_fp", keys_by_fp)
        fp_of = {k.as_tuple(): fp for fp, keys in keys_by_fp.items() for k in keys}
        object.__setattr__(self, "fp_of", fp_of)

    @property
    def distinct(self) -> int:
        return len(self.keys_by_fp)

    def split_twin(self, fp: str) -> str:
        """The fingerprint of `fp`'s measurement with the backward split as well."""
        return self.fingerprint_of(self.keys_by_fp[fp][0], True)


def fingerprint_candidates(
    spec: ModelSpec,
    space: planner.CandidateSpace,
    options: PlanOptions,
    worker_info: dict[str, object],
    keeper: LeaseKeeper,
    reuse_stages: bool = True,
    micro_batch_size: int = 0,
) -> JobCandidates:
    """Every candidate of `space` with its stage fingerprint on the workers' device kind and
    jax version; `reuse_stages` False makes each key's fingerprint its own (a baseline that
    measures every candidate, as Alpa does); `micro_batch_size`: the count's size in a job
    that searches counts (0: the job plans one)."""
    from workers.measure import remat_spec, stage_fingerprint

    device_kind = str(worker_info["device_kind"])
    jax_version = str(worker_info["jax_version"])

    def fingerprint_of(key: StageKey, split_backward: bool | None = None) -> str:
        submesh, config = space.resolve(key)
        return stage_fingerprint(
            remat_spec(spec, config.remat),
            key.start,
            key.end,
            submesh,
            config,
            device_kind,
            jax_version,
            options,
            split_backward,
        )

    rows = []
    for i, key in enumerate(space.keys):
        if i % 256 == 0:
            keeper.check()
        submesh, config = space.resolve(key)
        fp = fingerprint_of(key)
        if not reuse_stages:
            fp = hashlib.sha256(f"{fp}/{key.as_tuple()}".encode()).hexdigest()
        # the profile table's strategy column names the remat variant too: "data+full"
        shown = config.strategy + ("" if config.remat == "as_written" else f"+{config.remat}")
        rows.append(store.CandidateIn(key, fp, submesh.num_devices, shown, micro_batch_size))
    return JobCandidates(tuple(rows), fingerprint_of)


@dataclass(frozen=True)
class JobContext:
    """What the phases of one job read: who runs it, what it plans, where results go."""

    job_id: str
    owner: str
    model_id: str
    spec: ModelSpec
    cluster: ClusterSpec
    options: PlanOptions
    space: planner.CandidateSpace
    candidates: JobCandidates
    store: StoreRetry
    keeper: LeaseKeeper
    ledger: StageLedger
    stats: JobStats
    phase: MeasuringPhase
    layout: Layout
    # whether stored measurements of other jobs are reused (RunnerConfig.reuse_stages)
    reuse_stages: bool = True
    # estimate search: stages on every device estimated by scaling (whole-model stages,
    # planner.with_layer_profiles; the layers outside the pipeline, planner.outside), and
    # the whole-model stages measured directly
    scaled: frozenset[Key] = frozenset()
    direct: tuple[Key, ...] = ()
    # a job that searches counts: this count's micro-batch size and its spec's key in the
    # measuring pool (0 and the model id in a job of one count)
    micro_batch_size: int = 0
    model_key: str = ""

    @property
    def keys_by_fp(self) -> dict[str, list[StageKey]]:
        return self.candidates.keys_by_fp

    def by_group_shape(self, fingerprints: list[str]) -> list[str]:
        """`fingerprints` grouped by the shape of group that measures them."""
        return by_group_shape(fingerprints, self.keys_by_fp, self.space, self.layout)

    @property
    def splits_on_demand(self) -> bool:
        """Whether layer profiles are measured without the split backward first
        (`PlanOptions.splits_backward_on_demand`, in a job that shares its measurements by
        fingerprint)."""
        return self.options.splits_backward_on_demand and self.reuse_stages

    def unsplit_twin(self, fp: str) -> str:
        """The fingerprint of `fp`'s stage measured without the split backward."""
        return self.candidates.fingerprint_of(self.keys_by_fp[fp][0], False)

    def unsplit_routes(
        self, fingerprints: Sequence[str], unsplit: Collection[str]
    ) -> dict[str, str]:
        """Each of `fingerprints` in `unsplit` -> its unsplit twin, the stage measured in its
        place; the ledger records the twin's result for the job's candidates of it too."""
        twins = {fp: self.unsplit_twin(fp) for fp in fingerprints if fp in unsplit}
        self.ledger.aliases.update({t: fp for fp, t in twins.items()})
        return twins

    def measure(
        self,
        fingerprints: list[str],
        sink: ResultSink | None,
        keep_idle: bool = False,
        unsplit: Collection[str] = (),
    ) -> None:
        """Measure the stages of `fingerprints` on the job's measuring phase, results fed to
        `sink` (see `MeasuringPhase.run`); those of `unsplit` without the split backward,
        as their own stages (`unsplit_twin`), recorded for these candidates as well."""
        keys_by_fp = self.keys_by_fp
        twins = self.unsplit_routes(fingerprints, unsplit)
        if twins:
            keys_by_fp = {**keys_by_fp, **{t: keys_by_fp[fp] for fp, t in twins.items()}}
        self.phase.run(
            [twins.get(fp, fp) for fp in fingerprints],
            keys_by_fp,
            self.space.submeshes,
            sink,
            self.stats,
            self.keeper,
            self.ledger,
            keep_idle=keep_idle,
            unsplit=set(twins.values()),
        )

    def skip(self, fingerprints: Sequence[str]) -> None:
        """Mark the stages of `fingerprints` as not needed (pruned)."""
        self.phase.skip(list(fingerprints), self.stats)
