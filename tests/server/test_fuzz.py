"""Bad input never becomes a 500: random and mutated bodies and queries over HTTP."""

import json
import os
from typing import Any
from urllib.parse import quote

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.factories import exported_chain_spec

OK_OR_REFUSED = {200, 201, 202, 400, 404, 409, 413, 415, 422}
FUZZ = settings(
    max_examples=int(os.environ.get("STAGEPROF_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def mutate(body: Any, path: list[int], value: Any) -> Any:
    """Replace the node reached by following `path` (indices into keys/items) with `value`."""
    if not path or not isinstance(body, dict | list) or not body:
        return value
    if isinstance(body, dict):
        key = sorted(body)[path[0] % len(body)]
        return {**body, key: mutate(body[key], path[1:], value)}
    i = path[0] % len(body)
    return [*body[:i], mutate(body[i], path[1:], value), *body[i + 1 :]]


VALID_PLAN = {
    "model": exported_chain_spec(num_layers=2).model_dump(mode="json"),
    "cluster": {"num_hosts": 1, "devices_per_host": 2},
    "options": {"num_microbatches": 2},
}
VALID_ZOO = {"zoo": {"name": "gpt", "config": {"num_layers": 2}}, "options": {}}


def post(api: httpx.Client, path: str, body: Any) -> int:
    text = json.dumps(body, allow_nan=True)  # NaN/Infinity are sent as JSON extensions
    r = api.post(path, content=text, headers={"Content-Type": "application/json"})
    assert r.status_code in OK_OR_REFUSED, (r.status_code, r.text[:500])
    assert "detail" in r.json() or r.status_code < 300
    return r.status_code


@FUZZ
@given(
    base=st.sampled_from([VALID_PLAN, VALID_ZOO]),
    path=st.lists(st.integers(0, 50), max_size=6),
    value=json_values,
)
def test_mutated_plan_requests(api: httpx.Client, base: dict, path: list[int], value: Any) -> None:
    post(api, "/v1/plans", mutate(base, path, value))


@FUZZ
@given(path=st.lists(st.integers(0, 50), max_size=7), value=json_values)
def test_mutated_models(api: httpx.Client, path: list[int], value: Any) -> None:
    post(api, "/v1/models", mutate(VALID_PLAN["model"], path, value))


@FUZZ
@given(body=json_values)
def test_random_bodies(api: httpx.Client, body: Any) -> None:
    post(api, "/v1/plans", body)


@FUZZ
@given(
    params=st.dictionaries(
        st.sampled_from(
            [
                "job_id",
                "model_id",
                "start_min",
                "end_max",
                "submesh_id",
                "status",
                "sort",
                "limit",
                "cursor",
                "format",
                "strategy",
                "num_devices",
            ]
        ),
        st.text(max_size=30) | st.integers(-(2**70), 2**70).map(str),
        max_size=5,
    )
)
def test_random_profile_queries(api: httpx.Client, params: dict) -> None:
    r = api.get("/v1/profiles", params=params)
    assert r.status_code in {200, 400, 422}, (r.status_code, r.text[:500])


@FUZZ
@given(job_id=st.text(min_size=1, max_size=80).filter(lambda t: t.strip(".") != ""))
def test_random_ids(api: httpx.Client, job_id: str) -> None:
    path = "/v1/jobs/" + quote(job_id, safe="")
    for method in ("GET", "DELETE"):
        r = api.request(method, path)
        assert r.status_code in {307, 400, 404}, (method, job_id, r.status_code, r.text[:300])
