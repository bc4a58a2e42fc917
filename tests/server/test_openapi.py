"""The OpenAPI document is complete: every endpoint, examples, errors, stable operation ids."""

import httpx

EXPECTED = {
    ("post", "/v1/models"),
    ("get", "/v1/models"),
    ("get", "/v1/models/{model_id}"),
    ("post", "/v1/plans"),
    ("get", "/v1/jobs"),
    ("get", "/v1/jobs/{job_id}"),
    ("delete", "/v1/jobs/{job_id}"),
    ("post", "/v1/jobs/{job_id}/cancel"),
    ("get", "/v1/jobs/{job_id}/plan"),
    ("get", "/v1/jobs/{job_id}/cost-matrix"),
    ("get", "/v1/profiles"),
    ("get", "/v1/profiles/{fingerprint}"),
    ("get", "/healthz"),
    ("get", "/metrics"),
}


def test_openapi_document(api: httpx.Client) -> None:
    doc = api.get("/openapi.json").json()
    ops = {(m, p): op for p, item in doc["paths"].items() for m, op in item.items()}
    assert set(ops) == EXPECTED
    ids = [op["operationId"] for op in ops.values()]
    assert len(set(ids)) == len(ids) and "plans-submit_plan" in ids
    for (method, path), op in ops.items():
        assert op.get("summary"), (method, path)
        if path.startswith("/v1/") and "{" in path:
            assert "404" in op["responses"], (method, path)
    for path in ("/v1/plans", "/v1/models"):
        body = ops[("post", path)]["requestBody"]["content"]["application/json"]
        assert body["examples"], path
        assert "422" in ops[("post", path)]["responses"]
        assert "401" in ops[("post", path)]["responses"]
    plan_examples = ops[("post", "/v1/plans")]["requestBody"]["content"]["application/json"]
    assert {"zoo", "zoo_short", "stored", "inline"} <= set(plan_examples["examples"])
    assert "text/csv" in ops[("get", "/v1/profiles")]["responses"]["200"]["content"]
    assert "ValidationErrorOut" in doc["components"]["schemas"]
    for (method, path), op in ops.items():
        assert "400" in op["responses"], (method, path)  # a NUL in any URL
        if path.startswith("/v1/"):
            assert {"401", "422"} <= set(op["responses"]), (method, path)
    assert ops[("delete", "/v1/jobs/{job_id}")]["deprecated"] is True
    assert "cancel" in ops[("post", "/v1/jobs/{job_id}/cancel")]["summary"].lower()


def test_schema_states_per_field_rules(api: httpx.Client) -> None:
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    var = schemas["VarSpec"]["properties"]
    assert var["name"]["pattern"].startswith("^[A-Za-z_]")
    assert "float32" in var["dtype"]["enum"] and "complex64" not in var["dtype"]["enum"]
    assert var["shape"]["maxItems"] == 8 and var["shape"]["items"]["minimum"] == 1
    layer = schemas["LayerSpec"]["properties"]
    assert layer["forward"]["pattern"] and layer["saved"]["uniqueItems"] is True
    assert schemas["RequestedCluster"]["properties"]["devices_per_host"]["enum"][:3] == [1, 2, 4]
    assert "gpt" in schemas["ZooRef"]["properties"]["name"]["enum"]
    profiles = api.get("/openapi.json").json()["paths"]["/v1/profiles"]["get"]
    cursor = next(p for p in profiles["parameters"] if p["name"] == "cursor")
    assert cursor["schema"]["anyOf"][0]["pattern"] == "^[A-Za-z0-9_-]*$"


def test_allow_names_every_method_of_the_path(api: httpx.Client) -> None:
    r = api.options("/v1/jobs/any")
    assert r.status_code == 204 and r.headers["allow"] == "DELETE, GET, OPTIONS"
    r = api.put("/v1/models")
    assert r.status_code == 405 and r.headers["allow"] == "GET, OPTIONS, POST"
    assert api.options("/v1/jobs/any/cancel").headers["allow"] == "OPTIONS, POST"
    assert api.options("/no/such/path").status_code == 404


def test_examples_are_accepted(api: httpx.Client) -> None:
    doc = api.get("/openapi.json").json()
    content = doc["paths"]["/v1/plans"]["post"]["requestBody"]["content"]["application/json"]
    for name in ("zoo", "zoo_short", "inline"):
        r = api.post("/v1/plans", json=content["examples"][name]["value"])
        assert r.status_code == 202, (name, r.text)
    model = doc["paths"]["/v1/models"]["post"]["requestBody"]["content"]["application/json"]
    assert api.post("/v1/models", json=model["examples"]["tiny"]["value"]).status_code in (200, 201)
