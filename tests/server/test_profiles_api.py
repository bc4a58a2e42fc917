"""GET /v1/profiles over HTTP: filters, every sort with nulls last, keyset pages, CSV."""

import base64
import csv
import io
import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, delete

from server.routes.profiles import _csv_cell
from store import Base, make_sessionmaker
from store.queries import PROFILE_COLUMNS, SORT_KEYS
from tests.server.factories import SeededJob, seed_job
from tests.server.live import LiveServer


@pytest.fixture(scope="module")
def two_jobs(engine: Engine) -> Iterator[tuple[SeededJob, SeededJob]]:
    """A done job and a half-recorded one, shared by this module's (read-only) tests."""
    db = make_sessionmaker(engine)
    done = seed_job(db, num_layers=5, salt="a")
    running = seed_job(db, num_layers=4, finished=False, recorded_fraction=0.5, salt="b", pruned=5)
    yield done, running
    with engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(delete(table))


@pytest.fixture(scope="module")
def api(live_server: LiveServer, two_jobs: object) -> Iterator[httpx.Client]:
    """A client that leaves the module's rows in place."""
    with httpx.Client(base_url=live_server.url, timeout=30) as client:
        yield client


def all_pages(api: httpx.Client, limit: int, **params: Any) -> list[dict]:
    rows: list[dict] = []
    cursor = None
    for _ in range(1000):
        q = params | {"limit": limit} | ({"cursor": cursor} if cursor else {})
        r = api.get("/v1/profiles", params=q)
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["items"]) <= limit
        rows += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return rows
    raise AssertionError("pagination did not end")


def expected_order(rows: list[dict], key: str, descending: bool) -> list[int]:
    def value(r: dict) -> Any:
        v = r[key]
        return datetime.fromisoformat(v) if key == "recorded_at" else v

    valued = sorted(
        (r for r in rows if r[key] is not None),
        key=lambda r: (value(r), r["id"]),
        reverse=descending,
    )
    nulls = sorted((r for r in rows if r[key] is None), key=lambda r: r["id"], reverse=descending)
    return [r["id"] for r in valued + nulls]


@pytest.mark.parametrize("descending", [False, True], ids=["asc", "desc"])
@pytest.mark.parametrize("key", SORT_KEYS)
def test_every_sort_pages_through_all_rows_in_order(
    api: httpx.Client, two_jobs: tuple[SeededJob, SeededJob], key: str, descending: bool
) -> None:
    done, running = two_jobs
    sort = ("-" if descending else "") + key
    rows = all_pages(api, limit=7, sort=sort)
    assert len(rows) == done.num_candidates + running.num_candidates
    assert len({r["id"] for r in rows}) == len(rows)
    assert [r["id"] for r in rows] == expected_order(rows, key, descending)
    if key != "start":
        assert any(r[key] is None for r in rows)  # the nulls tail was paged through too


def test_filters(api: httpx.Client, two_jobs: tuple[SeededJob, SeededJob]) -> None:
    done, running = two_jobs
    everything = all_pages(api, limit=1000)

    def check(params: dict, keep: Any) -> None:
        got = all_pages(api, limit=1000, **params)
        want = [r for r in everything if keep(r)]
        assert sorted(r["id"] for r in got) == sorted(r["id"] for r in want), params
        assert want, params  # each filter is exercised on some rows

    check({"job_id": done.job_id}, lambda r: r["job_id"] == done.job_id)
    check({"model_id": running.model_id}, lambda r: r["model_id"] == running.model_id)
    check({"start_min": 1, "end_max": 3}, lambda r: r["start"] >= 1 and r["end"] <= 3)
    check({"submesh_id": 1, "config_id": 1}, lambda r: (r["submesh_id"], r["config_id"]) == (1, 1))
    check({"num_devices": 2}, lambda r: r["num_devices"] == 2)
    check({"strategy": "megatron"}, lambda r: r["strategy"] == "megatron")
    check({"status": "ok"}, lambda r: r["status"] == "ok")
    check({"status": ["oom", "compile_error"]}, lambda r: r["status"] in ("oom", "compile_error"))
    check({"status": "pending"}, lambda r: r["status"] is None)
    check({"status": "pruned"}, lambda r: r["status"] == "pruned")
    check({"status": ["pending", "ok"]}, lambda r: r["status"] in (None, "ok"))
    fp = everything[0]["fingerprint"]
    check({"fingerprint": fp}, lambda r: r["fingerprint"] == fp)
    check(
        {"job_id": done.job_id, "status": "ok", "submesh_id": 0, "start_min": 2},
        lambda r: (
            r["job_id"] == done.job_id
            and r["status"] == "ok"
            and r["submesh_id"] == 0
            and r["start"] >= 2
        ),
    )


def test_rows_carry_profile_fields(
    api: httpx.Client, two_jobs: tuple[SeededJob, SeededJob]
) -> None:
    done, _ = two_jobs
    rows = all_pages(api, limit=1000, job_id=done.job_id, status="ok")
    r = rows[0]
    assert r["forward_cost"] + r["backward_cost"] == pytest.approx(r["compute_cost"])
    assert r["submesh_hosts"] == 1 and r["mesh_dp"] * r["mesh_tp"] == r["num_devices"]
    # stored as 5; the row judges it on its job's devices (16 GiB: the rule's cap)
    assert r["max_n_succ_stages"] == 2**20 and r["error"] is None and r["recorded_at"]
    failed = all_pages(api, limit=1000, job_id=done.job_id, status="oom")
    assert failed[0]["compute_cost"] is None and "not" in failed[0]["error"]


def test_csv(api: httpx.Client, two_jobs: tuple[SeededJob, SeededJob]) -> None:
    done, _ = two_jobs
    r = api.get("/v1/profiles", params={"job_id": done.job_id, "format": "csv", "limit": 10})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    table = list(csv.reader(io.StringIO(r.text)))
    assert table[0] == list(PROFILE_COLUMNS) and len(table) == 11
    cursor = r.headers["x-next-cursor"]
    json_page = api.get(
        "/v1/profiles", params={"job_id": done.job_id, "limit": 10, "cursor": cursor}
    ).json()
    csv_page = api.get(
        "/v1/profiles",
        params={"job_id": done.job_id, "limit": 10, "cursor": cursor},
        headers={"Accept": "text/csv"},
    )
    ids = [int(row[0]) for row in list(csv.reader(io.StringIO(csv_page.text)))[1:]]
    assert ids == [row["id"] for row in json_page["items"]]
    last = api.get("/v1/profiles", params={"job_id": done.job_id, "format": "csv", "limit": 1000})
    assert "x-next-cursor" not in last.headers


def test_csv_cells_do_not_run_as_formulas() -> None:
    assert _csv_cell("=HYPERLINK(1)") == "'=HYPERLINK(1)"
    assert _csv_cell("@cmd") == "'@cmd" and _csv_cell("plain") == "plain"
    assert _csv_cell(-1) == -1 and _csv_cell(None) == ""


def forged(payload: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"sort": "cost"}, "sort"),
        ({"status": "great"}, "status.0"),
        ({"strategy": "no spaces!"}, "strategy"),  # names: data, maxtext, yours
        ({"start_min": -1}, "start_min"),
        ({"submesh_id": 2**40}, "submesh_id"),
        ({"start_min": 3, "end_max": 1}, "end_max"),
        ({"format": "xml"}, "format"),
        ({"cursor": "!!!"}, "cursor"),
        ({"cursor": forged([1, 2])}, "cursor"),
        ({"cursor": forged({"s": "start", "v": 1, "i": 1})}, "cursor"),  # other sort
        ({"cursor": forged({"s": "compute_cost", "v": "abc", "i": 1})}, "cursor"),
        ({"cursor": forged({"s": "compute_cost", "v": 1.0, "i": 2**70})}, "cursor"),
        ({"cursor": forged({"s": "compute_cost", "v": 1e400, "i": 1})}, "cursor"),
        ({"cursor": forged({"s": "compute_cost", "v": True, "i": 1})}, "cursor"),
        (
            {"cursor": forged({"s": "peak_memory", "v": 2**80, "i": 1}), "sort": "peak_memory"},
            "cursor",
        ),
        (
            {
                "cursor": forged({"s": "recorded_at", "v": {"t": "soon"}, "i": 1}),
                "sort": "recorded_at",
            },
            "cursor",
        ),
        ({"cursor": forged({"s": "start", "v": None, "i": 1}), "sort": "start"}, "cursor"),
        ({"cursor": "x" * 600}, "cursor"),
    ],
)
def test_bad_parameters_are_422(api: httpx.Client, params: dict, field: str) -> None:
    r = api.get("/v1/profiles", params=params)
    assert r.status_code == 422, r.text
    assert field in [e["field"] for e in r.json()["detail"]]


def test_cursor_value_types_round_trip(api: httpx.Client) -> None:
    for sort in ("compute_cost", "-recorded_at", "peak_memory"):
        first = api.get("/v1/profiles", params={"sort": sort, "limit": 2}).json()
        r = api.get(
            "/v1/profiles", params={"sort": sort, "limit": 2, "cursor": first["next_cursor"]}
        )
        assert r.status_code == 200
        assert not {x["id"] for x in first["items"]} & {x["id"] for x in r.json()["items"]}


def test_one_profile_in_full(api: httpx.Client, two_jobs: tuple[SeededJob, SeededJob]) -> None:
    row = api.get("/v1/profiles", params={"limit": 1}).json()["items"][0]
    full = api.get(f"/v1/profiles/{row['fingerprint']}")
    assert full.status_code == 200
    assert full.json()["fingerprint"] == row["fingerprint"]
    assert len(full.json()["module_profile_results"]) == 2
    assert api.get("/v1/profiles/nope").status_code == 404


@pytest.mark.parametrize("sort", ["compute_cost", "-peak_memory", "-recorded_at", "start"])
@pytest.mark.parametrize(
    "statuses",
    [["ok"], ["pending"], ["oom"], ["oom", "pending"], ["ok", "compile_error"], ["pruned"]],
)
def test_sorts_under_status_filters(
    api: httpx.Client, two_jobs: tuple[SeededJob, SeededJob], sort: str, statuses: list[str]
) -> None:
    everything = all_pages(api, limit=1000)
    want = [r for r in everything if (r["status"] or "pending") in statuses]
    got = all_pages(api, limit=4, sort=sort, status=statuses)
    assert [r["id"] for r in got] == expected_order(want, sort.lstrip("-"), sort.startswith("-"))
    assert got
