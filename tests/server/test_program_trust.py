"""The service computes the fingerprints it keys measurements by, from the programs: a spec
that claims another program's fingerprint is refused, and a blob jax cannot read is a 422
naming the layer; neither changes anything."""

import argparse
import base64
import json
from pathlib import Path

import httpx
import pytest

from cli.commands.zoo_args import load_model
from programs import layer_fingerprint
from tests.server.factories import exported_chain_spec
from tests.support.databases import RowCounts


def _doc(num_layers: int = 4, name: str = "chain") -> dict:
    return exported_chain_spec(num_layers, name=name).model_dump(mode="json")


def _swap_programs(doc: dict, into: int, source: int) -> dict:
    """`doc` with layer `into` running layer `source`'s programs (same signature, another
    computation) while keeping everything else, its claimed fingerprint included."""
    layers = [dict(layer) for layer in doc["layers"]]
    for key in ("forward", "backward"):
        layers[into][key] = layers[source][key]
    return {**doc, "layers": layers}


def test_a_claimed_fingerprint_must_be_the_programs_own(
    api: httpx.Client, row_counts: RowCounts
) -> None:
    victim = _doc(name="victim")
    stored = api.post("/v1/models", json=victim)
    assert stored.status_code == 201
    before = row_counts()

    forged = _swap_programs(_doc(name="victim"), into=1, source=2)
    forged["layers"][1]["jaxpr"] = victim["layers"][1]["jaxpr"]  # the text copied too
    r = api.post("/v1/models", json=forged)
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "layers", 1, "fingerprint"]
    claimed = victim["layers"][1]["fingerprint"]
    actual = victim["layers"][2]["fingerprint"]
    assert claimed in err["msg"] and actual in err["msg"]
    # inline in a plan request: refused the same way, and no job is queued
    plan = {"model": forged, "cluster": {"num_hosts": 1, "devices_per_host": 2}}
    r = api.post("/v1/plans", json=plan)
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "model.layers.1.fingerprint"
    assert row_counts() == before


def test_the_service_fills_in_fingerprints_and_ids_cover_programs(api: httpx.Client) -> None:
    victim = _doc(name="same")
    first = api.post("/v1/models", json=victim).json()
    # The same name and the same claimed fingerprints left out: other programs get their own
    # fingerprints and therefore another id, never the stored model's.
    other = _swap_programs(_doc(name="same"), into=1, source=2)
    for layer in other["layers"]:
        layer["fingerprint"] = ""
    second = api.post("/v1/models", json=other)
    assert second.status_code == 201
    body = second.json()
    assert body["id"] != first["id"]
    assert body["layer_fingerprints"][1] == victim["layers"][2]["fingerprint"]
    assert body["layer_fingerprints"][1] != first["layer_fingerprints"][1]
    # an honest spec without fingerprints gets exactly the SDK's
    unstamped = _doc(name="same")
    for layer in unstamped["layers"]:
        layer["fingerprint"] = ""
    again = api.post("/v1/models", json=unstamped)
    assert again.status_code == 200 and again.json()["id"] == first["id"]


def _corrupt(text: str, how: str) -> str:
    raw = bytearray(base64.b64decode(text))
    if how == "truncated":
        raw = raw[: len(raw) // 2]
    elif how == "flipped":
        for k in range(len(raw) // 3, len(raw) // 3 + 64):
            raw[k] ^= 0xFF
    else:
        raw = bytearray(b"\x00" * len(raw))
    return base64.b64encode(bytes(raw)).decode()


@pytest.mark.parametrize("how", ["truncated", "flipped", "zeroed"])
def test_a_corrupted_blob_is_a_422_naming_the_layer(
    api: httpx.Client, row_counts: RowCounts, how: str
) -> None:
    doc = _doc(num_layers=3)
    doc["layers"][2]["backward"] = _corrupt(doc["layers"][2]["backward"], how)
    before = row_counts()
    r = api.post("/v1/models", json=doc)
    assert r.status_code == 422, r.text
    fields = {e["field"] for e in r.json()["detail"]}
    assert fields <= {"layers.2.backward", "layers.2.forward", "layers.2.fingerprint"}
    assert any(f.startswith("layers.2.") for f in fields)
    r = api.post(
        "/v1/plans", json={"model": doc, "cluster": {"num_hosts": 1, "devices_per_host": 2}}
    )
    assert r.status_code == 422
    assert row_counts() == before


def test_fingerprints_do_not_depend_on_names() -> None:
    a = exported_chain_spec(3, name="a", width=8)
    b = exported_chain_spec(3, name="b", width=8)
    renamed = b.layers[1].model_copy(update={"name": "renamed_block", "jaxpr": "anything"})
    assert layer_fingerprint(renamed) == a.layers[1].fingerprint
    assert exported_chain_spec(3, width=16).layers[1].fingerprint != a.layers[1].fingerprint


def test_a_spec_file_given_to_the_cli_is_verified_the_same_way(tmp_path: Path) -> None:
    doc = _swap_programs(_doc(name="file"), into=1, source=2)
    path = tmp_path / "model.json"
    path.write_text(json.dumps(doc))
    args = argparse.Namespace(model=path)
    with pytest.raises(ValueError, match=r"layers\[1\]\.fingerprint"):
        load_model(args)
    for layer in doc["layers"]:
        layer["fingerprint"] = ""
    path.write_text(json.dumps(doc))
    loaded = load_model(args)
    assert loaded.layers[1].fingerprint == _doc()["layers"][2]["fingerprint"]
