"""POST/GET /v1/models over HTTP: idempotent storage, fingerprints, and every error path."""

import json

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from server import Settings
from store import ModelRow
from tests.server.factories import exported_chain_spec
from tests.server.live import LiveServer
from tests.support.databases import RowCounts


def spec_json(**kwargs: object) -> dict:
    return exported_chain_spec(**kwargs).model_dump(mode="json")  # type: ignore[arg-type]


def test_post_model_is_idempotent(api: httpx.Client, row_counts: RowCounts) -> None:
    first = api.post("/v1/models", json=spec_json(num_layers=3))
    assert first.status_code == 201
    body = first.json()
    assert body["created"] is True and body["num_layers"] == 3
    assert body["layer_fingerprints"] == [
        layer.fingerprint for layer in exported_chain_spec(3).layers
    ]
    assert len(set(body["layer_fingerprints"])) == 3
    assert body["url"] == f"/v1/models/{body['id']}"
    counts = row_counts()
    again = api.post("/v1/models", json=spec_json(num_layers=3))
    assert again.status_code == 200
    assert again.json()["id"] == body["id"] and again.json()["created"] is False
    assert row_counts() == counts


def test_get_model_with_and_without_programs(api: httpx.Client) -> None:
    model_id = api.post("/v1/models", json=spec_json(num_layers=2)).json()["id"]
    r = api.get(f"/v1/models/{model_id}")
    assert r.status_code == 200
    out = r.json()
    sent = exported_chain_spec(num_layers=2)
    assert [layer["fingerprint"] for layer in out["layers"]] == [
        layer.fingerprint for layer in sent.layers
    ]
    assert out["layers"][0]["param_bytes"] == 8 * 8 * 4
    assert out["spec"]["layers"][0]["forward"] == out["spec"]["layers"][0]["backward"] == ""
    assert "dot_general" in out["spec"]["layers"][0]["jaxpr"]
    full = api.get(f"/v1/models/{model_id}", params={"programs": "true"}).json()
    assert full["spec"]["layers"][1]["forward"] == sent.layers[1].forward
    assert full["spec"]["layers"][1]["backward"] == sent.layers[1].backward
    listed = api.get("/v1/models").json()
    assert [m["id"] for m in listed] == [model_id]


def test_unknown_model_is_404(api: httpx.Client) -> None:
    r = api.get("/v1/models/nope")
    assert r.status_code == 404 and "nope" in r.json()["detail"]


def test_bad_base64_program_names_the_field(api: httpx.Client, row_counts: RowCounts) -> None:
    body = spec_json(num_layers=2)
    body["layers"][1]["backward"] = "this is not base64!"
    before = row_counts()
    r = api.post("/v1/models", json=body)
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "layers", 1, "backward"]
    assert err["field"] == "layers.1.backward" and "base64" in err["msg"]
    assert row_counts() == before


def test_empty_program_is_422(api: httpx.Client) -> None:
    body = spec_json(num_layers=2)
    body["layers"][0]["forward"] = ""
    r = api.post("/v1/models", json=body)
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "layers.0.forward"


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b["layers"][0]["inputs"][0].update(shape=[4, 9]), ""),
        (lambda b: b.update(loss="nope"), ""),
        (lambda b: b["layers"][0].update(flops=-1), "layers.0.flops"),
        (lambda b: b["inputs"][0].update(dtype="complex128"), "inputs.0.dtype"),
        (lambda b: b.update(name="bad name with spaces"), "name"),
        (lambda b: b.update(extra_field=1), "extra_field"),
        (lambda b: b.pop("layers"), "layers"),
    ],
)
def test_rule_breaking_fields_are_422(
    api: httpx.Client, row_counts: RowCounts, mutate: object, field: str
) -> None:
    body = spec_json(num_layers=2)
    mutate(body)  # type: ignore[operator]
    before = row_counts()
    r = api.post("/v1/models", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert all(e["msg"] and e["loc"][0] == "body" for e in detail)
    if field:
        assert field in [e["field"] for e in detail]
    assert row_counts() == before


def test_non_finite_and_nul_are_422(api: httpx.Client, row_counts: RowCounts) -> None:
    body = spec_json(num_layers=2)
    text = json.dumps(body).replace('"flops": 512.0', '"flops": Infinity', 1)
    before = row_counts()
    r = api.post("/v1/models", content=text, headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "layers.0.flops"
    body["layers"][0]["jaxpr"] = "a\x00b"
    r = api.post("/v1/models", json=body)
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "layers.0.jaxpr"
    assert row_counts() == before


def test_malformed_json_is_400(api: httpx.Client, row_counts: RowCounts) -> None:
    before = row_counts()
    r = api.post("/v1/models", content=b'{"name": ', headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in r.json()["detail"]
    assert row_counts() == before


def test_non_json_body_is_415(api: httpx.Client) -> None:
    r = api.post("/v1/models", content=b"name=x", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415


def test_nul_in_url_is_400(api: httpx.Client) -> None:
    assert api.get("/v1/models/a%00b").status_code == 400
    assert api.get("/v1/profiles", params={"job_id": "a\x00"}).status_code == 400


def test_body_size_limit(db_url: str, db: object, row_counts: RowCounts) -> None:
    settings = Settings(database_url=db_url, max_model_bytes=32768)
    big = spec_json(num_layers=2)
    big["layers"][0]["jaxpr"] = "x" * 40000
    before = row_counts()
    with LiveServer(settings) as srv, httpx.Client(base_url=srv.url) as client:
        r = client.post("/v1/models", json=big)
        assert r.status_code == 413 and "32768" in r.json()["detail"]

        def chunks():  # no Content-Length: the limit is counted as the body streams
            yield json.dumps(big).encode()

        r = client.post(
            "/v1/models", content=chunks(), headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 413
        assert client.post("/v1/models", json=spec_json(num_layers=2)).status_code == 201
    assert row_counts()["models"] == before["models"] + 1


def test_concurrent_posts_of_one_spec(api: httpx.Client, row_counts: RowCounts) -> None:
    import threading

    body = spec_json(num_layers=4, name="raced")
    barrier = threading.Barrier(4)
    codes: list[int] = []

    def post() -> None:
        with httpx.Client(base_url=str(api.base_url), timeout=30) as c:
            barrier.wait()
            codes.append(c.post("/v1/models", json=body).status_code)

    threads = [threading.Thread(target=post) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(codes) == [200, 200, 200, 201]
    assert row_counts()["models"] == 1 and row_counts()["layer_programs"] == 4


def test_old_single_program_form_is_refused_with_what_to_do(
    api: httpx.Client, row_counts: RowCounts
) -> None:
    body = spec_json(num_layers=2)
    for layer in body["layers"]:
        layer["program"] = layer.pop("forward")
        for key in ("backward", "residuals", "saved", "grad_inputs"):
            layer.pop(key)
    before = row_counts()
    r = api.post("/v1/models", json=body)
    assert r.status_code == 422
    err = r.json()["detail"][0]
    assert err["field"] == "layers.0" and "upload it again" in err["msg"]
    assert row_counts() == before


def test_stored_old_form_model_is_409(api: httpx.Client, db: sessionmaker[Session]) -> None:
    skeleton = spec_json(num_layers=2)
    for layer in skeleton["layers"]:
        for key in ("forward", "backward", "jaxpr", "residuals", "saved", "grad_inputs"):
            layer.pop(key)
    with db.begin() as s:
        s.add(ModelRow(id="2" * 64, name="old", num_layers=2, spec=skeleton))
    r = api.get(f"/v1/models/{'2' * 64}")
    assert r.status_code == 409 and "upload it again" in r.json()["detail"]
    plan = {"model_id": "2" * 64, "cluster": {"num_hosts": 1, "devices_per_host": 2}}
    r = api.post("/v1/plans", json=plan)
    assert r.status_code == 409 and "old single-program layer form" in r.json()["detail"]
