"""An HTTP client for the stageprof API, speaking the `schemas` types.

    with StageprofClient("http://127.0.0.1:8000") as api:
        ref = api.submit_plan(zoo="gpt", zoo_config={"num_layers": 4}, cluster=ClusterSpec())
        job = api.wait_for_job(ref.job_id)
        plan = api.get_plan(job.id)

The token comes from `token=` or `STAGEPROF_API_TOKEN`. Every failure raises a
`StageprofError` with a readable message: `ServerUnreachable` when the server cannot be
reached, `ApiError` subclasses (with the status code and the server's `detail`) for error
answers, `JobTimeout` when a `wait_for_job` timeout given by the caller runs out.
"""

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict

from schemas import (
    ClusterSpec,
    Job,
    JobStatus,
    ModelSpec,
    Plan,
    PlanOptions,
    PlanRequest,
    StageProfileResult,
    ZooRef,
)
from schemas.settings import env_name, env_settings

TOKEN_ENV = env_name("api_token")
DEFAULT_URL = "http://127.0.0.1:8000"


class StageprofError(Exception):
    """Anything that went wrong talking to a stageprof server; `str()` is one readable line."""


class ServerUnreachable(StageprofError):
    """The server did not answer: refused, timed out, or the name does not resolve."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(
            f"cannot reach the server at {url}: {reason} (is `stageprof serve` running there?)"
        )
        self.url = url


class JobTimeout(StageprofError, TimeoutError):
    """`wait_for_job(timeout_s=...)` ran out while the job was still running."""


class ApiError(StageprofError):
    """An error answer: `status_code`, the server's `detail` (a string or field errors) and
    the request it answered (`method`, `url`)."""

    def __init__(self, status_code: int, detail: Any, method: str = "", url: str = "") -> None:
        where = f"{method} {url} " if url else ""
        super().__init__(f"{where}answered {status_code}: {describe_detail(detail)}")
        self.status_code = status_code
        self.detail = detail
        self.method = method
        self.url = url


def describe_detail(detail: Any) -> str:
    """The server's error body as one line: field errors as `field: reason; ...`."""
    if isinstance(detail, list):
        parts = []
        for err in detail:
            if isinstance(err, dict):
                field = err.get("field") or ".".join(str(p) for p in err.get("loc", []))
                parts.append(f"{field}: {err.get('msg', '')}" if field else str(err.get("msg")))
            else:
                parts.append(str(err))
        return "; ".join(parts)
    return " ".join(str(detail).split())


class AuthError(ApiError):
    """401 or 403: a token is missing or wrong, or writes are loopback-only."""


class NotFoundError(ApiError):
    """404: unknown id."""


class ConflictError(ApiError):
    """409: e.g. the plan of an unfinished job, cancelling a finished one."""


class InvalidRequest(ApiError):
    """400 or 422: malformed JSON or a field that breaks a rule (see `detail`)."""


_ERRORS: dict[int, type[ApiError]] = {
    400: InvalidRequest,
    401: AuthError,
    403: AuthError,
    404: NotFoundError,
    409: ConflictError,
    422: InvalidRequest,
}


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class ModelRef(_Answer):
    """What `POST /v1/models` answers."""

    id: str
    name: str
    num_layers: int
    created: bool
    layer_fingerprints: list[str]
    url: str


class JobRef(_Answer):
    """What `POST /v1/plans` answers."""

    job_id: str
    status: JobStatus
    model_id: str | None = None
    url: str
    dashboard_url: str
    deduplicated: bool = False
    deduplicated_by: str | None = None


class ProfilePage(_Answer):
    """One page of `GET /v1/profiles`; rows are dicts (see the API's ProfileRowOut)."""

    items: list[dict[str, Any]]
    next_cursor: str | None = None
    sort: str
    limit: int


class StageprofClient:
    """A synchronous client; use it as a context manager or call `close()`."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url
        token = token if token is not None else env_settings().api_token or None
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=base_url, headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "StageprofClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as err:
            raise ServerUnreachable(self.base_url, _reason(err)) from err
        if response.status_code >= 400:
            try:
                body = response.json()
                detail = body.get("detail", body) if isinstance(body, dict) else body
            except ValueError:
                detail = response.text or response.reason_phrase
            error = _ERRORS.get(response.status_code, ApiError)
            raise error(response.status_code, detail, method, str(response.request.url))
        return response

    # Models
    def put_model(self, spec: ModelSpec) -> ModelRef:
        """Store `spec` (idempotent: an equal spec gets the same id)."""
        r = self._request("POST", "/v1/models", json=spec.model_dump(mode="json"))
        return ModelRef.model_validate(r.json())

    def get_model(self, model_id: str, *, programs: bool = False) -> ModelSpec:
        """A stored spec; its layer programs are empty unless `programs`."""
        params = {"programs": "true" if programs else "false"}
        r = self._request("GET", f"/v1/models/{model_id}", params=params)
        return ModelSpec.model_validate(r.json()["spec"])

    # Plans and jobs
    def submit_plan(
        self,
        request: PlanRequest | None = None,
        *,
        model_id: str | None = None,
        model: ModelSpec | None = None,
        zoo: str | ZooRef | None = None,
        zoo_config: Mapping[str, Any] | None = None,
        cluster: ClusterSpec | None = None,
        options: PlanOptions | None = None,
        idempotency_key: str | None = None,
        new: bool = False,
    ) -> JobRef:
        """Queue a plan job for a stored model, an inline spec or a zoo model.

        With `idempotency_key` (e.g. a uuid4 string), sending the same request again (a
        retry) returns the job the key first made. Without `new`, an identical request whose
        job is still queued or running returns that job; either way `deduplicated` is True.
        """
        if request is None:
            if isinstance(zoo, str):
                zoo = ZooRef(name=zoo, config=dict(zoo_config or {}))
            request = PlanRequest(
                model_id=model_id,
                model=model,
                zoo=zoo,
                cluster=cluster or ClusterSpec(),
                options=options or PlanOptions(),
            )
        body = request.model_dump(mode="json", exclude_none=True)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
        params = {"new": "true"} if new else {}
        r = self._request("POST", "/v1/plans", json=body, headers=headers, params=params)
        return JobRef.model_validate(r.json())

    def get_job(self, job_id: str) -> Job:
        return Job.model_validate(self._request("GET", f"/v1/jobs/{job_id}").json())

    def list_jobs(self, *, status: JobStatus | None = None, limit: int = 50) -> list[Job]:
        params: dict[str, Any] = {"limit": limit}
        if status is not None:
            params["status"] = JobStatus(status).value
        items = self._request("GET", "/v1/jobs", params=params).json()["items"]
        return [Job.model_validate(j) for j in items]

    def cancel_job(self, job_id: str) -> Job:
        return Job.model_validate(self._request("DELETE", f"/v1/jobs/{job_id}").json())

    def wait_for_job(
        self,
        job_id: str,
        *,
        timeout_s: float | None = None,
        poll_s: float = 1.0,
        on_progress: Callable[[Job], None] | None = None,
    ) -> Job:
        """Poll until the job is done, failed or cancelled, however long that takes.

        `on_progress(job)` is called on every poll whose status or counts changed. With
        `timeout_s`, `JobTimeout` (a `TimeoutError`) once that many seconds have passed."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        seen: tuple[Any, ...] | None = None
        while True:
            job = self.get_job(job_id)
            state = (job.status, job.progress)
            if on_progress is not None and state != seen:
                on_progress(job)
            seen = state
            if job.status.finished:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeout(f"job {job_id} is still {job.status.value} after {timeout_s} s")
            wait = poll_s if deadline is None else min(poll_s, deadline - time.monotonic())
            time.sleep(max(0.0, wait))

    def get_plan(self, job_id: str) -> Plan:
        """The plan of a done job (ConflictError before that)."""
        return Plan.model_validate(self._request("GET", f"/v1/jobs/{job_id}/plan").json())

    def cost_matrix(self, job_id: str) -> dict[str, Any]:
        """Stage cost by (start, end) per submesh/config (the heatmap's data)."""
        return self._request("GET", f"/v1/jobs/{job_id}/cost-matrix").json()

    # Profiles
    def list_profiles(
        self,
        *,
        sort: str = "compute_cost",
        limit: int = 100,
        cursor: str | None = None,
        **filters: Any,
    ) -> ProfilePage:
        """One page of the profile table. Filters: model_id, job_id, start_min, end_max,
        submesh_id, config_id, status (str or list), num_devices, strategy, fingerprint."""
        params = _params(filters) | {"sort": sort, "limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        r = self._request("GET", "/v1/profiles", params=params)
        return ProfilePage.model_validate(r.json())

    def iter_profiles(self, *, sort: str = "compute_cost", **filters: Any) -> Iterator[dict]:
        """Every row matching `filters`, page by page."""
        cursor = None
        while True:
            page = self.list_profiles(sort=sort, limit=1000, cursor=cursor, **filters)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def profiles_csv(self, *, sort: str = "compute_cost", limit: int = 1000, **filters: Any) -> str:
        """One page of the profile table as CSV text."""
        params = _params(filters) | {"sort": sort, "limit": limit, "format": "csv"}
        return self._request("GET", "/v1/profiles", params=params).text

    def get_profile(self, fingerprint: str) -> StageProfileResult:
        r = self._request("GET", f"/v1/profiles/{fingerprint}")
        return StageProfileResult.model_validate(r.json())

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/healthz").json()


def _reason(err: httpx.TransportError) -> str:
    if isinstance(err, httpx.ConnectError):
        return "connection refused" if "refused" in str(err).lower() else f"cannot connect ({err})"
    if isinstance(err, httpx.TimeoutException):
        return "no answer in time"
    return str(err) or type(err).__name__


def _params(filters: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in filters.items() if v is not None}
