"""GET /v1/profiles: the profile table, filtered, sorted, cursor-paginated, JSON or CSV;
GET /v1/profiles/{fingerprint}: one stored measurement in full."""

import base64
import binascii
import csv
import io
import json
import math
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response

from schemas import TEXT_PATTERN, StageProfileResult
from schemas.sharding import STRATEGY_NAME_PATTERN
from server.api_models import ProfilePageOut, ProfileRowOut, error_responses
from server.checks import raise_if
from server.deps import SessionDep
from server.errors import NotFound, field_error
from store import get_profile, profile_result
from store.queries import (
    MAX_PAGE_SIZE,
    PROFILE_COLUMNS,
    PageCursor,
    ProfileFilter,
    ProfileSort,
    profile_page,
)

router = APIRouter(prefix="/v1/profiles", tags=["profiles"])

SortParam = Literal[
    "compute_cost",
    "-compute_cost",
    "peak_memory",
    "-peak_memory",
    "start",
    "-start",
    "recorded_at",
    "-recorded_at",
]
StatusParam = Literal[
    "ok",
    "oom",
    "compile_error",
    "runtime_error",
    "timeout",
    "worker_lost",
    "pending",
    "pruned",
    "estimated",
]
MAX_INT = 2**31 - 1
MAX_BIG = 2**63 - 1
CSV_TYPE = "text/csv"
# What encode_cursor writes: unpadded URL-safe base64.
CURSOR_PATTERN = r"^[A-Za-z0-9_-]*$"


def encode_cursor(sort: ProfileSort, cursor: PageCursor) -> str:
    value: Any = cursor.value
    if isinstance(value, datetime):
        value = {"t": value.isoformat()}
    raw = json.dumps({"s": str(sort), "v": value, "i": cursor.id}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(text: str, sort: ProfileSort) -> PageCursor:
    """The cursor a previous page returned; ValueError when it is not one for this sort."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        data = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError) as e:
        raise ValueError("not a cursor returned by this API") from e
    if not isinstance(data, dict) or set(data) != {"s", "v", "i"}:
        raise ValueError("not a cursor returned by this API")
    if data["s"] != str(sort):
        raise ValueError(f"the cursor was made for sort={data['s']}, not sort={sort}")
    row_id, value = data["i"], data["v"]
    if not _is_int(row_id, MAX_INT):
        raise ValueError("not a cursor returned by this API")
    return PageCursor(value=_cursor_value(sort.key, value), id=row_id)


def _is_int(v: Any, bound: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -bound <= v <= bound


def _cursor_value(key: str, value: Any) -> float | int | datetime | None:
    if value is None and key != "start":
        return None
    if key == "start" and _is_int(value, MAX_INT):
        return value
    if key == "peak_memory" and _is_int(value, MAX_BIG):
        return value
    if key == "compute_cost":
        if _is_int(value, MAX_BIG):
            return float(value)
        if isinstance(value, float) and math.isfinite(value):
            return value
    if key == "recorded_at" and isinstance(value, dict) and isinstance(value.get("t"), str):
        try:
            return datetime.fromisoformat(value["t"])
        except ValueError:
            pass
    raise ValueError("not a cursor returned by this API")


def _wants_csv(request: Request, fmt: str | None) -> bool:
    if fmt is not None:
        return fmt == "csv"
    accept = request.headers.get("accept", "")
    return CSV_TYPE in accept and "application/json" not in accept


def _csv_cell(v: Any) -> Any:
    """Values as text, lists joined by ", "; strings that a spreadsheet would run as a
    formula are quoted."""
    if v is None:
        return ""
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, list | tuple):
        v = ", ".join(str(x) for x in v)
    if isinstance(v, str) and v[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + v
    return v


def _csv(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(list(PROFILE_COLUMNS))
    for r in rows:
        writer.writerow([_csv_cell(r[name]) for name in PROFILE_COLUMNS])
    return out.getvalue()


IntParam = Annotated[int | None, Query(ge=0, le=MAX_INT)]


@router.get(
    "",
    response_model=ProfilePageOut,
    responses=error_responses(
        400, extra={200: {"content": {CSV_TYPE: {}}, "description": "JSON, or CSV on request."}}
    ),
    summary="The profile table: every stage candidate and its measurement",
)
def read_profiles(
    request: Request,
    session: SessionDep,
    model_id: Annotated[str | None, Query(max_length=64, pattern=TEXT_PATTERN)] = None,
    job_id: Annotated[str | None, Query(max_length=64, pattern=TEXT_PATTERN)] = None,
    start_min: Annotated[
        int | None, Query(ge=0, le=MAX_INT, description="Only stages with start >= this.")
    ] = None,
    end_max: Annotated[
        int | None, Query(ge=0, le=MAX_INT, description="Only stages with end <= this.")
    ] = None,
    submesh_id: IntParam = None,
    config_id: IntParam = None,
    status: Annotated[
        list[StatusParam] | None,
        Query(
            description="Repeat for several; 'pending': no result yet; 'pruned': skipped; "
            "'estimated': never measured, estimated only."
        ),
    ] = None,
    num_devices: Annotated[int | None, Query(ge=1, le=MAX_INT)] = None,
    strategy: Annotated[
        str | None,
        Query(
            pattern=STRATEGY_NAME_PATTERN,
            description="data, megatron, fsdp, or a mesh-axes config's rule table name.",
        ),
    ] = None,
    fingerprint: Annotated[str | None, Query(max_length=64, pattern=TEXT_PATTERN)] = None,
    micro_batch_size: Annotated[
        int | None,
        Query(
            ge=0,
            le=MAX_INT,
            description="Only candidates at this micro-batch size (a job that searched counts "
            "of micro-batches has candidates per size; 0: jobs of one count).",
        ),
    ] = None,
    sort: Annotated[
        SortParam, Query(description="Sort key; '-' for descending. Nulls always last.")
    ] = "compute_cost",
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 100,
    cursor: Annotated[
        str | None,
        Query(
            max_length=512,
            pattern=CURSOR_PATTERN,
            description="The `next_cursor` (or `X-Next-Cursor`) of the previous page, for the "
            "same `sort`: an opaque token (URL-safe base64) made by this API; any other value "
            "is a 422.",
        ),
    ] = None,
    format: Annotated[
        Literal["json", "csv"] | None, Query(description="Or send Accept: text/csv.")
    ] = None,
) -> Any:
    """Filter by model, job, layer range (`start_min`, `end_max`), submesh, config, status,
    devices, strategy or fingerprint; sort by cost, memory, start or time; page with the
    opaque `next_cursor` (in JSON, or the `X-Next-Cursor` header of CSV).

    The rules between fields: `end_max >= start_min`; a `cursor` is one this API returned
    for the same `sort` (422 otherwise)."""
    if start_min is not None and end_max is not None and start_min > end_max:
        raise_if([field_error(("query", "end_max"), "must be >= start_min")])
    order = ProfileSort.parse(sort)
    after = None
    if cursor is not None:
        try:
            after = decode_cursor(cursor, order)
        except ValueError as e:
            raise_if([field_error(("query", "cursor"), str(e))])
    filters = ProfileFilter(
        model_id=model_id,
        job_id=job_id,
        start_min=start_min,
        end_max=end_max,
        submesh_id=submesh_id,
        config_id=config_id,
        statuses=tuple(status or ()),
        num_devices=num_devices,
        strategy=strategy,
        fingerprint=fingerprint,
        micro_batch_size=micro_batch_size,
    )
    page = profile_page(session, filters=filters, sort=order, limit=limit, after=after)
    next_cursor = encode_cursor(order, page.next) if page.next is not None else None
    if _wants_csv(request, format):
        headers = {"X-Next-Cursor": next_cursor} if next_cursor else {}
        return Response(_csv(page.rows), media_type=CSV_TYPE, headers=headers)
    return ProfilePageOut(
        items=[ProfileRowOut(**r) for r in page.rows],
        next_cursor=next_cursor,
        sort=str(order),
        limit=limit,
    )


@router.get(
    "/{fingerprint}",
    response_model=StageProfileResult,
    responses=error_responses(404),
    summary="One stored stage measurement, in full",
)
def read_profile(
    fingerprint: Annotated[str, Path(pattern=TEXT_PATTERN, description="A stage fingerprint.")],
    session: SessionDep,
) -> StageProfileResult:
    row = get_profile(session, fingerprint=fingerprint)
    if row is None:
        raise NotFound(f"no profile with fingerprint {fingerprint!r}")
    return profile_result(row)
