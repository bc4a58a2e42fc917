"""Response bodies of the API that are not contracts of their own in `schemas`."""

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas import Job, ModelSpec


class Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class ErrorOut(Out):
    detail: str = Field(description="What went wrong, in one line.")


class FieldErrorOut(Out):
    loc: list[str | int] = Field(description="Path of the offending field, e.g. body.options.")
    field: str = Field(description="Dotted field path without its 'body'/'query' prefix.")
    msg: str = Field(description="The rule it breaks.")
    type: str = Field(description="Error kind (pydantic's error type).")


class ValidationErrorOut(Out):
    detail: list[FieldErrorOut]


class LayerInfo(Out):
    index: int
    name: str
    fingerprint: str = Field(description="Layer fingerprint (or a hash of its program).")
    inputs: list[str]
    outputs: list[str]
    num_params: int
    param_bytes: int
    flops: float = Field(description="Forward FLOPs per micro-batch.")
    residual_bytes: int = Field(
        0, description="What its forward keeps for its backward per micro-batch, bytes."
    )


class ModelCreated(Out):
    id: str = Field(description="Content hash of the spec; the same spec gets the same id.")
    name: str
    num_layers: int
    created: bool = Field(description="False when an equal spec was already stored.")
    layer_fingerprints: list[str]
    url: str


class ModelSummary(Out):
    id: str
    name: str
    num_layers: int
    created_at: datetime


class ModelOut(ModelSummary):
    layers: list[LayerInfo]
    spec: ModelSpec = Field(
        description="The stored spec; layer programs are empty unless ?programs=true."
    )


class JobCreated(Out):
    job_id: str
    status: str
    model_id: str | None = Field(None, description="Null for a zoo job until it is built.")
    url: str = Field(description="The job's API URL.")
    dashboard_url: str
    deduplicated: bool = Field(
        False,
        description="True when this is an existing job rather than a new one (answered 200, "
        "not 202): see `deduplicated_by`.",
    )
    deduplicated_by: Literal["idempotency_key", "identical_request"] | None = Field(
        None,
        description="'idempotency_key': the job first submitted with this Idempotency-Key; "
        "'identical_request': a queued or running job of an identical request (same model, "
        "cluster and options; ask for a new one with ?new=true).",
    )


class JobList(Out):
    items: list[Job]
    next_before: str | None = Field(None, description="Pass as ?before= for the next page.")


class ProfileRowOut(Out):
    """One stage candidate of a job and its measurement (null fields until recorded)."""

    id: int
    job_id: str
    model_id: str | None
    start: int
    end: int = Field(description="Last layer, inclusive.")
    submesh_id: int
    config_id: int
    micro_batch_size: int = Field(
        description="The micro-batch size it runs at, in a job that searched counts of "
        "micro-batches (each count's candidates are its own); 0: a job of one count."
    )
    num_devices: int
    strategy: str
    status: str | None = Field(
        description="ok or the failure kind; 'pruned' (skipped: it cannot be in a better "
        "plan), 'estimated' (never measured: estimated from layer profiles); null while pending."
    )
    compute_cost: float | None = Field(description="forward + backward, seconds.")
    estimated_cost: float | None = Field(
        description="The job's estimate of forward + backward from its layer profiles, "
        "seconds (search: estimate): set on estimated candidates and on measured ones that "
        "were estimated before being measured; null when the job made no estimate of it."
    )
    forward_cost: float | None = Field(description="seconds")
    backward_cost: float | None = Field(description="seconds")
    peak_memory: int | None = Field(description="bytes per device")
    initial_var_size: int | None = Field(description="bytes per device")
    intermediate_size: int | None = Field(description="bytes per device per micro-batch")
    max_n_succ_stages: int | None = Field(
        description="Alpa's 1F1B memory rule on this row's job's devices (-1: does not fit)"
    )
    submesh_hosts: int | None
    submesh_devices: int | None
    mesh_dp: int | None
    mesh_tp: int | None
    compile_seconds: float | None
    reused: bool
    fingerprint: str
    profile_id: int | None
    recorded_at: datetime | None
    error: str | None
    measured_by: list[str] | None = Field(
        description="The processes that measured it, one `<node>:<pid>` per host of its "
        "submesh (empty for results stored before it was recorded); null while pending."
    )


class ProfilePageOut(Out):
    items: list[ProfileRowOut]
    next_cursor: str | None = Field(None, description="Pass as ?cursor= for the next page.")
    sort: str
    limit: int


class CostMatrixOut(Out):
    submesh_id: int
    config_id: int
    num_devices: int
    strategy: str
    submesh: tuple[int, int] | None = Field(description="(hosts, devices_per_host).")
    logical_mesh: tuple[int, int] | None = Field(description="(dp, tp).")
    label: str
    compute_cost: list[list[float | None]] = Field(
        description="[start][end] forward + backward seconds; null if missing, failed or "
        "estimated only."
    )
    estimated_cost: list[list[float | None]] = Field(
        description="[start][end] the job's estimate of forward + backward, seconds; null "
        "where it made none (search: estimate only)."
    )
    status: list[list[str | None]] = Field(description="[start][end] status or null.")


class CostMatricesOut(Out):
    job_id: str
    num_layers: int
    layer_names: list[str]
    micro_batch_size: int | None = Field(
        None,
        description="The micro-batch size the matrices are of, in a job that searched counts "
        "of micro-batches (default: the plan's, or while it runs the largest); null: a job "
        "of one count.",
    )
    micro_batch_sizes: list[int] = Field(
        default_factory=list,
        description="Every size the job searched (ask for one with ?micro_batch_size=); "
        "empty: a job of one count.",
    )
    matrices: list[CostMatrixOut]


class HealthOut(Out):
    status: str
    database: str


def error_responses(
    *codes: int, extra: dict[int | str, dict[str, Any]] | None = None
) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` for the error codes a route can answer (plus `extra`): 400, 401
    and 422 always (any URL can carry a NUL; reads need a token where the server closes them)."""
    text = {
        400: "Malformed JSON, or NUL characters in the URL.",
        401: "A bearer token is needed: for writes when the server has STAGEPROF_API_TOKEN, "
        "for reads too when it closes them.",
        403: "Writes without a token are accepted only from loopback clients.",
        404: "Unknown id.",
        409: "Conflicts with the resource's state.",
        413: "Request body too large.",
        415: "The body is not JSON.",
        503: "The database is unavailable.",
    }
    out: dict[int | str, dict[str, Any]] = {
        c: {"model": ErrorOut, "description": text[c]} for c in sorted({400, 401, *codes})
    }
    out[422] = {"model": ValidationErrorOut, "description": "A field breaks a rule."}
    return out | (extra or {})
