"""Idempotent submission over HTTP: Idempotency-Key, identical requests, ?new=true."""

import threading
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from client.sdk import ConflictError, StageprofClient
from schemas import ClusterSpec, PlanOptions
from store import claim_job, put_model, session_scope
from tests.server.factories import exported_chain_spec
from tests.server.live import LiveServer
from tests.support.databases import RowCounts

CLUSTER = {"num_hosts": 1, "devices_per_host": 2}
GPT: dict[str, Any] = {"zoo": "gpt", "config": {"num_layers": 2}, "cluster": CLUSTER}


def _jobs(api: httpx.Client, row_counts: RowCounts) -> tuple[int, int]:
    """The number of jobs as the API lists them and as the database holds them."""
    listed = len(api.get("/v1/jobs", params={"limit": 200}).json()["items"])
    return listed, row_counts()["jobs"]


def _post(api: httpx.Client, body: dict, key: str | None = None, **params: str) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return api.post("/v1/plans", json=body, headers=headers, params=params)


def test_the_same_key_gets_the_same_job(api: httpx.Client, row_counts: RowCounts) -> None:
    key = str(uuid.uuid4())
    first = _post(api, GPT, key)
    assert first.status_code == 202 and first.json()["deduplicated"] is False
    again = _post(api, GPT, key)
    assert again.status_code == 200, again.text
    out = again.json()
    assert out["job_id"] == first.json()["job_id"] and out["deduplicated"] is True
    assert out["deduplicated_by"] == "idempotency_key"
    assert again.headers["location"] == first.headers["location"]
    assert _jobs(api, row_counts) == (1, 1)
    # Still the same job once it has ended (and even with ?new=true: the key wins).
    assert api.delete(out["url"]).json()["status"] == "cancelled"
    late = _post(api, GPT, key, new="true")
    assert late.status_code == 200 and late.json()["job_id"] == out["job_id"]
    assert late.json()["status"] == "cancelled"
    assert _jobs(api, row_counts) == (1, 1)


def test_the_same_key_with_another_body_is_409(api: httpx.Client, row_counts: RowCounts) -> None:
    assert _post(api, GPT, "key-1").status_code == 202
    before = _jobs(api, row_counts)
    other = GPT | {"options": {"num_microbatches": 2}}
    r = _post(api, other, "key-1")
    assert r.status_code == 409
    assert (
        "Idempotency-Key 'key-1'" in r.json()["detail"]
        and "different request" in r.json()["detail"]
    )
    assert _jobs(api, row_counts) == before


def test_an_identical_request_while_queued_gets_that_job(
    api: httpx.Client, row_counts: RowCounts
) -> None:
    first = _post(api, GPT).json()
    # The same request written differently: the short zoo form, defaults spelled out.
    same = {
        "zoo": {"name": "gpt", "config": {"num_layers": 2}},
        "cluster": CLUSTER | {"device_kind": "cpu"},
        "options": {"num_microbatches": 4, "optimizer": "adam"},
    }
    r = _post(api, same)
    assert r.status_code == 200, r.text
    assert r.json()["job_id"] == first["job_id"]
    assert r.json()["deduplicated_by"] == "identical_request"
    assert _jobs(api, row_counts) == (1, 1)
    # A different request is a different job.
    other = _post(api, GPT | {"options": {"num_microbatches": 2}})
    assert other.status_code == 202 and other.json()["job_id"] != first["job_id"]
    assert _jobs(api, row_counts) == (2, 2)


def test_new_asks_for_a_new_job(api: httpx.Client, row_counts: RowCounts) -> None:
    first = _post(api, GPT).json()
    second = _post(api, GPT, new="true")
    assert second.status_code == 202 and second.json()["deduplicated"] is False
    assert second.json()["job_id"] != first["job_id"]
    assert _jobs(api, row_counts) == (2, 2)
    third = _post(api, GPT)  # the oldest of the equal jobs
    assert third.status_code == 200 and third.json()["job_id"] == first["job_id"]


def test_only_unfinished_jobs_are_reused(
    api: httpx.Client, db: sessionmaker[Session], row_counts: RowCounts
) -> None:
    with session_scope(db) as s:
        model_id = put_model(s, spec=exported_chain_spec(num_layers=3))[0].id
    body = {"model_id": model_id, "cluster": CLUSTER, "options": {"num_microbatches": 2}}
    first = _post(api, body).json()
    with session_scope(db) as s:
        assert claim_job(s, owner="runner-1", lease_seconds=60, job_id=first["job_id"])
    running = _post(api, body)
    assert running.status_code == 200 and running.json()["job_id"] == first["job_id"]
    assert running.json()["status"] == "profiling"
    api.delete(first["url"])  # cancel requested: its runner stops it, so it is not reused
    after_cancel = _post(api, body)
    assert after_cancel.status_code == 202
    assert after_cancel.json()["job_id"] != first["job_id"]
    assert _jobs(api, row_counts) == (2, 2)


@pytest.mark.parametrize("key", ["", "has space", "x" * 129, "naïve"])
def test_a_bad_key_is_422_naming_the_header(
    api: httpx.Client, row_counts: RowCounts, key: str
) -> None:
    r = api.post("/v1/plans", json=GPT, headers={"Idempotency-Key": key.encode()})
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["detail"]] == ["Idempotency-Key"]
    assert _jobs(api, row_counts) == (0, 0)


@pytest.mark.parametrize("key", ["one-key", None], ids=["one key", "no key, identical"])
def test_concurrent_requests_make_one_job(
    api: httpx.Client, live_server: LiveServer, row_counts: RowCounts, key: str | None
) -> None:
    answers: list[httpx.Response] = []
    start = threading.Barrier(6)

    def post() -> None:
        with httpx.Client(base_url=live_server.url, timeout=60) as client:
            start.wait()
            answers.append(_post(client, GPT, key))

    threads = [threading.Thread(target=post) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in answers) == [200] * 5 + [202], [r.text for r in answers]
    if key is not None:
        assert len({r.json()["job_id"] for r in answers}) == 1
    else:
        assert {r.json()["deduplicated_by"] for r in answers} == {None, "identical_request"}
    assert _jobs(api, row_counts) == (1, 1)


def test_the_sdk_sends_the_key(api: httpx.Client, live_server: LiveServer) -> None:
    cluster = ClusterSpec(num_hosts=1, devices_per_host=2)
    with StageprofClient(live_server.url, token="") as sdk:
        first = sdk.submit_plan(zoo="gpt", zoo_config={"num_layers": 2}, cluster=cluster)
        retry = sdk.submit_plan(
            zoo="gpt", zoo_config={"num_layers": 2}, cluster=cluster, idempotency_key="sdk-1"
        )
        assert retry.job_id == first.job_id and retry.deduplicated  # identical request
        fresh = sdk.submit_plan(zoo="gpt", zoo_config={"num_layers": 2}, cluster=cluster, new=True)
        assert fresh.job_id != first.job_id and not fresh.deduplicated
        keyed = sdk.submit_plan(
            zoo="gpt",
            zoo_config={"num_layers": 2},
            cluster=cluster,
            idempotency_key="sdk-2",
            new=True,
        )
        again = sdk.submit_plan(
            zoo="gpt",
            zoo_config={"num_layers": 2},
            cluster=cluster,
            idempotency_key="sdk-2",
            new=True,
        )
        assert again.job_id == keyed.job_id and again.deduplicated_by == "idempotency_key"
        with pytest.raises(ConflictError):
            sdk.submit_plan(
                zoo="gpt",
                zoo_config={"num_layers": 2},
                cluster=cluster,
                options=PlanOptions(num_microbatches=2),
                idempotency_key="sdk-2",
            )
        sdk.cancel_job(first.job_id)
        late = sdk.submit_plan(
            zoo="gpt", zoo_config={"num_layers": 2}, cluster=cluster, idempotency_key="sdk-1"
        )
        assert late.job_id == first.job_id and late.deduplicated_by == "idempotency_key"
        assert late.status == "cancelled"


def test_a_new_key_names_the_job_it_was_answered_with(
    api: httpx.Client, row_counts: RowCounts
) -> None:
    first = _post(api, GPT).json()  # no key
    keyed = _post(api, GPT, "late-key")
    assert keyed.status_code == 200 and keyed.json()["job_id"] == first["job_id"]
    assert keyed.json()["deduplicated_by"] == "identical_request"
    api.delete(first["url"])
    retry = _post(api, GPT, "late-key")  # the job ended: the key still finds it
    assert retry.status_code == 200 and retry.json()["job_id"] == first["job_id"]
    assert retry.json()["deduplicated_by"] == "idempotency_key"
    assert _jobs(api, row_counts) == (1, 1)


def test_a_job_named_by_one_key_is_not_given_to_another(
    api: httpx.Client, row_counts: RowCounts
) -> None:
    first = _post(api, GPT, "key-a").json()
    other = _post(api, GPT, "key-b")  # identical, but key-a names the queued job
    assert other.status_code == 202 and other.json()["job_id"] != first["job_id"]
    plain = _post(api, GPT)  # no key: the oldest equal job
    assert plain.status_code == 200 and plain.json()["job_id"] == first["job_id"]
    assert _jobs(api, row_counts) == (2, 2)
