"""POST /v1/plans over HTTP: stored, inline and zoo models; every refusal changes nothing."""

import json

import httpx
import pytest

from schemas.plan import MAX_MEASURE_STAGES
from tests.server.factories import exported_chain_spec
from tests.support.databases import RowCounts

CLUSTER = {"num_hosts": 1, "devices_per_host": 2}


def test_plan_for_a_stored_model(api: httpx.Client) -> None:
    spec = exported_chain_spec(num_layers=3).model_dump(mode="json")
    model_id = api.post("/v1/models", json=spec).json()["id"]
    r = api.post(
        "/v1/plans",
        json={"model_id": model_id, "cluster": CLUSTER, "options": {"num_microbatches": 2}},
    )
    assert r.status_code == 202
    out = r.json()
    assert out["status"] == "queued" and out["model_id"] == model_id
    assert r.headers["location"] == out["url"] == f"/v1/jobs/{out['job_id']}"
    job = api.get(out["url"]).json()  # committed before the answer was sent
    assert job["status"] == "queued" and job["options"]["num_microbatches"] == 2
    assert job["cluster"]["devices_per_host"] == 2 and job["model_name"] == "chain"


def test_plan_for_an_inline_model_stores_it(api: httpx.Client, row_counts: RowCounts) -> None:
    spec = exported_chain_spec(num_layers=2).model_dump(mode="json")
    r = api.post("/v1/plans", json={"model": spec, "cluster": CLUSTER})
    assert r.status_code == 202
    model_id = r.json()["model_id"]
    assert api.get(f"/v1/models/{model_id}").status_code == 200
    assert row_counts()["models"] == 1 and row_counts()["jobs"] == 1
    again = api.post("/v1/plans?new=true", json={"model": spec, "cluster": CLUSTER})
    assert again.json()["model_id"] == model_id
    assert row_counts()["models"] == 1 and row_counts()["jobs"] == 2


@pytest.mark.parametrize(
    "body",
    [
        {"zoo": {"name": "gpt", "config": {"num_layers": 2, "hidden_size": 32}}},
        {"zoo": "gpt", "config": {"num_layers": 2, "hidden_size": 32}},
    ],
    ids=["zoo-ref", "short-form"],
)
def test_zoo_plan(api: httpx.Client, body: dict) -> None:
    r = api.post("/v1/plans", json=body | {"cluster": CLUSTER})
    assert r.status_code == 202, r.text
    job = api.get(r.json()["url"]).json()
    assert job["model_id"] is None and job["model_name"] == "zoo:gpt"
    assert job["zoo"] == {"name": "gpt", "config": {"num_layers": 2, "hidden_size": 32}}


def test_zoo_preset(api: httpx.Client) -> None:
    r = api.post("/v1/plans", json={"zoo": "gpt", "config": {"preset": "125M"}})
    assert r.status_code == 202


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"zoo": "resnet"}, "zoo.name", "unknown zoo model"),
        ({"zoo": "gpt", "config": {"layers": 2}}, "zoo.config.layers", "no override"),
        ({"zoo": "gpt", "config": {"num_layers": "two"}}, "zoo.config.num_layers", "integer"),
        ({"zoo": "gpt", "config": {"num_layers": 0}}, "zoo.config.num_layers", "must be in [1,"),
        ({"zoo": "gpt", "config": {"num_layers": True}}, "zoo.config.num_layers", "integer"),
        ({"zoo": "mlp", "config": {"preset": "huge"}}, "zoo.config.preset", "unknown preset"),
        ({"zoo": "gpt", "cluster": {"devices_per_host": 3}}, "cluster.devices_per_host", "power"),
        ({"zoo": "gpt", "cluster": {"num_hosts": 0}}, "cluster.num_hosts", ""),
        ({"zoo": "gpt", "options": {"num_microbatches": 0}}, "options.num_microbatches", ""),
        ({"zoo": "gpt", "options": {"strategies": ["data", "data"]}}, "options.strategies", ""),
        (
            {"zoo": "gpt", "options": {"global_batch_size": 6, "num_microbatches": 4}},
            "options",
            "divide",
        ),
        (
            {"zoo": "gpt", "options": {"submesh_space": "manual", "manual_submeshes": [[1, 8]]}},
            "options.manual_submeshes.0",
            "does not fit",
        ),
        ({"zoo": "gpt", "cluster": {"device_kind": "a\u0000b"}}, "cluster.device_kind", "NUL"),
        ({"zoo": "gpt", "config": {"preset": "x\u0000"}}, "zoo.config.preset", ""),
        ({}, "", "exactly one"),
        ({"zoo": "gpt", "model_id": "abc"}, "", "exactly one"),
        ({"zoo": "gpt", "surprise": 1}, "surprise", ""),
        ({"model_id": "x" * 65}, "model_id", ""),
    ],
)
def test_rule_breaking_requests_are_422(
    api: httpx.Client, row_counts: RowCounts, body: dict, field: str, words: str
) -> None:
    before = row_counts()
    r = api.post("/v1/plans", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert all(set(e) == {"loc", "field", "msg", "type"} for e in detail)
    if field:
        assert field in [e["field"] for e in detail], detail
    assert words in json.dumps(detail)
    assert row_counts() == before


def test_micro_batch_must_match_the_stored_spec(api: httpx.Client, row_counts: RowCounts) -> None:
    model_id = api.post(
        "/v1/models", json=exported_chain_spec(batch=4).model_dump(mode="json")
    ).json()["id"]
    before = row_counts()
    bad = {"model_id": model_id, "options": {"num_microbatches": 4, "global_batch_size": 8}}
    r = api.post("/v1/plans", json=bad)
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["field"] == "options.global_batch_size" and "micro-batch 4" in err["msg"]
    assert row_counts() == before
    good = {"model_id": model_id, "options": {"num_microbatches": 4, "global_batch_size": 16}}
    assert api.post("/v1/plans", json=good).status_code == 202


def test_inline_model_micro_batch_and_programs(api: httpx.Client, row_counts: RowCounts) -> None:
    spec = exported_chain_spec(batch=4).model_dump(mode="json")
    before = row_counts()
    r = api.post(
        "/v1/plans",
        json={"model": spec, "options": {"num_microbatches": 2, "global_batch_size": 4}},
    )
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "options.global_batch_size"
    spec["layers"][2]["forward"] = "%%%"
    r = api.post("/v1/plans", json={"model": spec})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "model.layers.2.forward"
    assert row_counts() == before


def test_unknown_model_id_is_404(api: httpx.Client, row_counts: RowCounts) -> None:
    before = row_counts()
    r = api.post("/v1/plans", json={"model_id": "0" * 64})
    assert r.status_code == 404 and "not found" in r.json()["detail"]
    assert row_counts() == before


@pytest.mark.parametrize(
    "content",
    [b"", b"{", b"[1, 2", b"null", b"[]", b'"zoo"', b"\xff\xfe", b"{" * 100_000],
)
def test_malformed_or_wrongly_shaped_bodies(
    api: httpx.Client, row_counts: RowCounts, content: bytes
) -> None:
    before = row_counts()
    r = api.post("/v1/plans", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code in (400, 422), (r.status_code, r.text)
    assert "detail" in r.json()
    assert row_counts() == before


def test_measure_stages_past_the_model_are_422_before_anything_is_queued(
    api: httpx.Client, row_counts: RowCounts
) -> None:
    spec = exported_chain_spec(num_layers=3).model_dump(mode="json")
    model_id = api.post("/v1/models", json=spec).json()["id"]
    inside = {"start": 1, "end": 2, "submesh_id": 0, "config_id": 0}
    past = {"start": 1, "end": 3, "submesh_id": 0, "config_id": 0}
    backwards = {"start": 2, "end": 1, "submesh_id": 0, "config_id": 0}
    before = row_counts()
    for model in ({"model_id": model_id}, {"model": spec}):
        bad = model | {"cluster": CLUSTER, "options": {"measure_stages": [inside, past]}}
        r = api.post("/v1/plans", json=bad)
        assert r.status_code == 422, r.text
        (err,) = r.json()["detail"]
        assert err["field"] == "options.measure_stages.1.end"
        assert "layer 3 is past the model's last layer (2)" in err["msg"]
        r = api.post("/v1/plans", json=bad | {"options": {"measure_stages": [backwards]}})
        assert r.status_code == 422, r.text
        (err,) = r.json()["detail"]
        assert err["field"] == "options.measure_stages.0" and "must be >= start" in err["msg"]
        assert row_counts() == before
    too_many = {"measure_stages": [inside] * (MAX_MEASURE_STAGES + 1)}
    r = api.post("/v1/plans", json={"model_id": model_id, "options": too_many})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "options.measure_stages"
    assert row_counts() == before
    good = {"model_id": model_id, "cluster": CLUSTER, "options": {"measure_stages": [inside]}}
    r = api.post("/v1/plans", json=good)
    assert r.status_code == 202, r.text
    job = api.get(r.json()["url"]).json()
    assert job["options"]["measure_stages"] == [inside]
    # a zoo model is built by the runner: its keys are not checked here (the runner ignores
    # a key that is not one of the job's candidates)
    zoo = {"zoo": "gpt", "config": {"num_layers": 2}, "options": {"measure_stages": [past]}}
    assert api.post("/v1/plans", json=zoo | {"cluster": CLUSTER}).status_code == 202
