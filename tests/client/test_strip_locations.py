"""Exported programs carry no path of the tracing machine; stripping keeps what they compute."""

import base64
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import client
import programs
from schemas import ModelSpec
from tests.client.helpers import assert_roundtrip

DIR_NAME = "stageprof_secret_project_q7x"
MODEL_SOURCE = """
import jax.numpy as jnp
import client


def proprietary_loss(p, batch):
    with client.layer("embed"):
        h = jnp.tanh(batch["x"] @ p["w0"])
    with client.layer("head"):
        return jnp.mean((h @ p["w1"] - batch["y"]) ** 2)
"""


def user_module(tmp_path: Path) -> ModuleType:
    """The user's model code, imported from a directory of a distinctive name."""
    where = tmp_path / DIR_NAME / "models.py"
    where.parent.mkdir(parents=True)
    where.write_text(MODEL_SOURCE)
    spec = importlib.util.spec_from_file_location("stageprof_user_models", where)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def traced(tmp_path: Path) -> tuple[ModelSpec, ModuleType, dict, dict]:
    module = user_module(tmp_path)
    k = jax.random.split(jax.random.key(0), 4)
    params = {"w0": jax.random.normal(k[0], (8, 8)) / 3, "w1": jax.random.normal(k[1], (8, 8))}
    batch = {"x": jax.random.normal(k[2], (4, 8)), "y": jax.random.normal(k[3], (4, 8))}
    return client.trace(module.proprietary_loss, params, batch, name="m"), module, params, batch


def program_bytes(spec: ModelSpec) -> list[bytes]:
    fields = ("forward", "backward")
    return [base64.b64decode(getattr(layer, f)) for layer in spec.layers for f in fields]


def local_paths(tmp_path: Path) -> list[bytes]:
    return [
        DIR_NAME.encode(),
        str(tmp_path).encode(),
        str(Path.home()).encode(),
        os.getcwd().encode(),
        b"proprietary_loss",
        b".py",
    ]


def test_exported_layers_carry_no_local_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, module, params, batch = traced(tmp_path)
    for raw in program_bytes(spec):
        for path in local_paths(tmp_path):
            assert path not in raw, path
    assert_roundtrip(spec, module.proprietary_loss, params, batch, cuts=(1,))

    # Without stripping the same trace holds the paths, and fingerprints do not change.
    monkeypatch.setattr("client.export.strip_locations", bytes)
    with_locations = traced(tmp_path / "again")[0]
    assert any(DIR_NAME.encode() in raw for raw in program_bytes(with_locations))
    assert [layer.fingerprint for layer in with_locations.layers] == [
        layer.fingerprint for layer in spec.layers
    ]
    stripped = programs.without_locations(with_locations)
    assert [programs.layer_fingerprint(layer) for layer in stripped.layers] == [
        layer.fingerprint for layer in spec.layers
    ]
    assert not any(DIR_NAME.encode() in raw for raw in program_bytes(stripped))


def test_strip_keeps_vjps_and_results(tmp_path: Path) -> None:
    def f(x: jax.Array) -> jax.Array:
        return jnp.sin(x) * x

    exported = jax.export.export(jax.jit(f))(jax.ShapeDtypeStruct((3,), np.float32))
    raw = exported.serialize(vjp_order=2)
    here = Path(__file__).name.encode()
    assert here in raw
    out = jax.export.deserialize(bytearray(programs.strip_locations(raw)))
    assert here not in programs.strip_locations(raw)
    assert out.has_vjp() and out.vjp().has_vjp() and not out.vjp().vjp().has_vjp()
    x = jnp.arange(3.0, dtype=np.float32)
    np.testing.assert_allclose(out.call(x), f(x))
    grad2 = jax.grad(jax.grad(lambda v: out.call(v * jnp.ones(3)).sum()))(1.5)
    np.testing.assert_allclose(grad2, jax.grad(jax.grad(lambda v: f(v * jnp.ones(3)).sum()))(1.5))
    again = programs.strip_locations(programs.strip_locations(raw))
    assert again == programs.strip_locations(raw)
