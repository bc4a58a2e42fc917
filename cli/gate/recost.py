"""Today's measurements of the baseline's stages, read from today's job's profile table.

A baseline stage is found among today's candidates by its range and its (submesh, config)
ids; the candidate's measurement must be on the same submesh and config (the ids index the
job's choices, which follow the cluster and options). A stage today's job pruned, or never
enumerated, has no measurement: the verdict notes it.
"""

from collections.abc import Sequence
from typing import Any, Protocol

from cli.gate.verdict import Remeasured
from schemas import PlannedStage, StageProfileResult

PRUNED = "pruned"


class ProfileSource(Protocol):
    """Reads a job's profile table: the API (`remote.py`) or the store (`local.py`)."""

    def candidates(self, job_id: str, stage: PlannedStage) -> list[dict[str, Any]]:
        """Rows of the job's profile table inside the stage's range on its submesh/config."""
        ...

    def result(self, fingerprint: str) -> StageProfileResult | None:
        """The stored measurement with this stage fingerprint."""
        ...


def remeasure(
    source: ProfileSource, job_id: str, stages: Sequence[PlannedStage]
) -> list[Remeasured]:
    """One `Remeasured` per stage, in order."""
    return [_one(source, job_id, st) for st in stages]


def _one(source: ProfileSource, job_id: str, stage: PlannedStage) -> Remeasured:
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
    if status == PRUNED:
        return Remeasured(missing="pruned: today's job found it could not be in a better plan")
    result = source.result(rows[0]["fingerprint"])
    if result is None:
        return Remeasured(missing="its measurement is not stored")
    if result.submesh != stage.submesh or result.config != stage.config:
        today = f"{result.submesh} as {result.config.label()}"
        return Remeasured(missing=f"today's candidate with these ids is {today}")
    return Remeasured(result=result)
