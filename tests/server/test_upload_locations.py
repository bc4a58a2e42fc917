"""Uploaded programs are stored without the uploader's source locations (file paths)."""

import base64
from pathlib import Path

import httpx
import jax.numpy as jnp
import pytest

import client
from schemas import ModelSpec

MARK = "uploader_private_dir_k2v"


def located_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> ModelSpec:
    """A spec whose programs keep their locations (as a client without the SDK's stripping
    would send): its loss is defined in a file under a directory named `MARK`."""
    where = tmp_path / MARK / "model.py"
    where.parent.mkdir(parents=True)
    where.write_text(
        "import jax.numpy as jnp\nimport client\n\n"
        "def loss(p, b):\n"
        "    with client.layer('a'):\n"
        "        h = jnp.tanh(b['x'] @ p['w0'])\n"
        "    with client.layer('b'):\n"
        "        return jnp.mean((h @ p['w1']) ** 2)\n"
    )
    scope: dict = {}
    exec(compile(where.read_text(), str(where), "exec"), scope)  # noqa: S102 - our own file
    monkeypatch.setattr("client.export.strip_locations", bytes)
    params = {"w0": jnp.ones((8, 8)), "w1": jnp.ones((8, 8)) / 2}
    spec = client.trace(scope["loss"], params, {"x": jnp.ones((4, 8))}, name=name)
    monkeypatch.undo()
    assert any(MARK.encode() in raw for raw in programs_of(spec.model_dump(mode="json")))
    return spec


def programs_of(spec: dict) -> list[bytes]:
    return [base64.b64decode(layer[f]) for layer in spec["layers"] for f in ("forward", "backward")]


def stored_programs(api: httpx.Client, model_id: str) -> list[bytes]:
    r = api.get(f"/v1/models/{model_id}", params={"programs": "true"})
    assert r.status_code == 200, r.text
    return programs_of(r.json()["spec"])


def test_uploads_are_stored_without_locations(
    api: httpx.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = located_spec(tmp_path, monkeypatch, "located")
    r = api.post("/v1/models", json=spec.model_dump(mode="json"))
    assert r.status_code == 201, r.text
    assert r.json()["layer_fingerprints"] == [layer.fingerprint for layer in spec.layers]
    stored = stored_programs(api, r.json()["id"])
    assert stored and not any(MARK.encode() in raw or b".py" in raw for raw in stored)

    inline = located_spec(tmp_path / "plan", monkeypatch, "located_inline")
    body = {
        "model": inline.model_dump(mode="json"),
        "cluster": {"num_hosts": 1, "devices_per_host": 2},
        "options": {"num_microbatches": 1},
    }
    r = api.post("/v1/plans", json=body)
    assert r.status_code == 202, r.text
    stored = stored_programs(api, r.json()["model_id"])
    assert not any(MARK.encode() in raw for raw in stored)
