"""Today's measurements of the baseline's stages, read from today's job's profile table.

The gate asks today's job to measure the baseline's stages (`measure_baseline`:
`PlanOptions.measure_stages`), whatever its search would decide, so that a verdict never
rests on an estimate. A baseline stage is found among today's candidates by its range and
its (submesh, config) ids; the candidate's measurement must be on the same submesh and
config (the ids index the job's choices, which follow the cluster and options). A stage
today's job pruned, only estimated, or never enumerated, has no measurement: the verdict
notes it.
"""

from collections.abc import Sequence
from typing import Any, Protocol

from cli.gate.verdict import Remeasured
from schemas import PlannedStage, PlanOptions, StageKey, StageProfileResult
from schemas.plan import MAX_MEASURE_STAGES

PRUNED = "pruned"
ESTIMATED = "estimated"
UNMEASURED = {
    PRUNED: "pruned: today's job found it could not be in a better plan",
    ESTIMATED: "estimated only: today's job did not measure it",
}


class ProfileSource(Protocol):
    """Reads a job's profile table: the API (`remote.py`) or the store (`local.py`)."""

    def candidates(self, job_id: str, stage: PlannedStage) -> list[dict[str, Any]]:
        """Rows of the job's profile table inside the stage's range on its submesh/config."""
        ...

    def result(self, fingerprint: str) -> StageProfileResult | None:
        """The stored measurement with this stage fingerprint."""
        ...


def baseline_keys(stages: Sequence[PlannedStage], num_layers: int | None = None) -> list[StageKey]:
    """The baseline's stages as stage keys, each once, in order, at most
    `MAX_MEASURE_STAGES`; with `num_layers` (today's model, when known), without the stages
    past its last layer (a model that lost layers: they are no candidates today)."""
    keys: dict[tuple[int, int, int, int], StageKey] = {}
    for st in stages:
        if num_layers is not None and st.end >= num_layers:
            continue
        key = StageKey(start=st.start, end=st.end, submesh_id=st.submesh_id, config_id=st.config_id)
        keys.setdefault(key.as_tuple(), key)
    return list(keys.values())[:MAX_MEASURE_STAGES]


def measure_baseline(
    options: PlanOptions, stages: Sequence[PlannedStage], num_layers: int | None = None
) -> PlanOptions:
    """`options` asking today's job to measure the baseline's stages too (unchanged when
    there is no baseline stage to ask for)."""
    asked = baseline_keys(stages, num_layers)
    if not asked:
        return options
    have = {k.as_tuple() for k in options.measure_stages}
    extra = [k for k in asked if k.as_tuple() not in have]
    wanted = [*options.measure_stages, *extra][:MAX_MEASURE_STAGES]
    return options.model_copy(update={"measure_stages": wanted})


def remeasure(
    source: ProfileSource, job_id: str, stages: Sequence[PlannedStage], *, device_memory_bytes: int
) -> list[Remeasured]:
    """One `Remeasured` per stage, in order: a measurement only, never an estimate. Each
    is seen with today's device memory: a stage measured by another job (a baseline's, on a
    bigger device) is judged against today's devices, not the ones it was measured with."""
    return [_one(source, job_id, st, device_memory_bytes) for st in stages]


def _one(
    source: ProfileSource, job_id: str, stage: PlannedStage, device_memory_bytes: int
) -> Remeasured:
    rows = [
        r
        for r in source.candidates(job_id, stage)
        if r["start"] == stage.start and r["end"] == stage.end
    ]
    if not rows:
        return Remeasured(missing="not a stage candidate of today's job")
    status = rows[0]["status"]
    if status is None:
        return Remeasured(missing="still pending when today's job ended")
    if status in UNMEASURED:
        # whatever the store now holds under its fingerprint, today's job did not measure it
        return Remeasured(missing=UNMEASURED[status])
    result = source.result(rows[0]["fingerprint"])
    if result is None:
        return Remeasured(missing="its measurement is not stored")
    if result.submesh != stage.submesh or result.config != stage.config:
        today = f"{result.submesh} as {result.config.label()}"
        return Remeasured(missing=f"today's candidate with these ids is {today}")
    return Remeasured(result=result.for_device_memory(device_memory_bytes))
