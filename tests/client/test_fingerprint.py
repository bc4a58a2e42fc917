"""Layer fingerprints: computation and shapes only; never names, locations, colours or values."""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import client
from client import zoo
from client.fingerprint import canonical_jaxpr
from programs import layer_fingerprint

SMALL = {"num_layers": 3, "hidden_size": 16, "num_heads": 2, "seq_len": 8, "vocab_size": 32}


@pytest.fixture(scope="module")
def gpt():
    return zoo.build("gpt", **SMALL)


def prints(spec) -> dict[str, str]:
    return {layer.name: layer.fingerprint for layer in spec.layers}


def test_transformer_blocks_share_one_fingerprint(gpt) -> None:
    fp = prints(gpt)
    assert fp["block0"] == fp["block1"] == fp["block2"]
    assert len({fp["embed"], fp["block0"], fp["head"]}) == 3
    assert all(len(f) == 64 for f in fp.values())


def test_fingerprint_is_recomputable_from_the_layer(gpt) -> None:
    for layer in gpt.layers:
        assert layer_fingerprint(layer) == layer.fingerprint


def test_changing_a_width_changes_what_depends_on_it(gpt) -> None:
    base = prints(gpt)
    wider = prints(zoo.build("gpt", **(SMALL | {"hidden_size": 32})))
    assert all(wider[name] != base[name] for name in base)
    vocab = prints(zoo.build("gpt", **(SMALL | {"vocab_size": 64})))
    assert vocab["embed"] != base["embed"] and vocab["head"] != base["head"]
    assert vocab["block0"] == base["block0"]
    deeper = prints(zoo.build("gpt", **(SMALL | {"num_layers": 5})))
    assert deeper["block4"] == base["block0"] and deeper["head"] == base["head"]


def _dense(p: dict, b: dict[str, jax.Array]) -> jax.Array:
    with client.layer("dense"):
        return jnp.mean(jnp.tanh(b["x"] @ p["w"]))


def _dense_elsewhere(q: dict, data: dict[str, jax.Array]) -> jax.Array:
    # The same computation written at another source location with other names.
    with client.layer("other_name"):
        hidden = data["inp"] @ q["kernel"]
        return jnp.mean(jnp.tanh(hidden))


def test_independent_of_names_locations_and_values() -> None:
    concrete = client.trace(_dense, {"w": jnp.full((4, 3), 0.5)}, {"x": jnp.ones((2, 4))}).layers[0]
    other = client.trace(
        _dense_elsewhere,
        {"kernel": jax.ShapeDtypeStruct((4, 3), jnp.float32)},
        {"inp": jax.ShapeDtypeStruct((2, 4), jnp.float32)},
    ).layers[0]
    assert concrete.fingerprint == other.fingerprint
    different_op = client.trace(
        lambda p, b: jnp.mean(jnp.sin(b["x"] @ p["w"])),
        {"w": jnp.ones((4, 3))},
        {"x": jnp.ones((2, 4))},
    ).layers[0]
    assert different_op.fingerprint != concrete.fingerprint
    different_dtype = client.trace(
        _dense, {"w": jnp.ones((4, 3), jnp.bfloat16)}, {"x": jnp.ones((2, 4), jnp.bfloat16)}
    ).layers[0]
    assert different_dtype.fingerprint != concrete.fingerprint


def test_constants_are_part_of_the_computation() -> None:
    def with_const(value: float):
        def loss(p: jax.Array, b: dict[str, jax.Array]) -> jax.Array:
            return jnp.mean(b["x"] @ p + jnp.asarray([value] * 3, jnp.float32))

        return client.trace(loss, jnp.ones((4, 3)), {"x": jnp.ones((2, 4))}).layers[0].fingerprint

    assert with_const(1.0) == with_const(1.0)
    assert with_const(1.0) != with_const(2.0)


def test_canonical_jaxpr_strips_names_addresses_and_locations() -> None:
    a = "{ lambda ; a:f32[2] b:f32[2]. let c:f32[2] = add a b in (c,) }  # f.py:3"
    b = "{ lambda ; x:f32[2] y:f32[2]. let z:f32[2] = add x y in (z,) }"
    assert canonical_jaxpr(a) == canonical_jaxpr(b)
    swapped = "{ lambda ; x:f32[2] y:f32[2]. let z:f32[2] = add y x in (z,) }"
    assert canonical_jaxpr(swapped) != canonical_jaxpr(b)
    addr = "jvp=<function f at 0x7f3a2c1b0>"
    assert canonical_jaxpr(addr) == canonical_jaxpr("jvp=<function f at 0xdeadbeef>")


def test_canonical_jaxpr_strips_terminal_colours() -> None:
    plain = "{ lambda ; a:f32[2]. let b:f32[2] = sin a in (b,) }"
    coloured = "{ \x1b[34mlambda\x1b[0m ; a:f32[2]. let b:f32[2] = \x1b[1msin\x1b[0m a in (b,) }"
    assert canonical_jaxpr(coloured) == canonical_jaxpr(plain)


_TRACE_SCRIPT = """
import json, client
from client import zoo
spec = zoo.build("gpt", num_layers=2, hidden_size=16, num_heads=2, seq_len=8, vocab_size=32)
import jax
print("FP " + json.dumps([layer.fingerprint for layer in spec.layers]))
print("COLOURED", "\\x1b[" in str(jax.make_jaxpr(lambda x: x + 1)(1.0)))
print("PLAIN_TEXT", not any("\\x1b[" in layer.jaxpr for layer in spec.layers))
"""


def _traced_fingerprints(seed: str, tty: bool) -> list[str]:
    """Trace in a fresh process; under a pseudo-terminal jax colours printed jaxprs."""
    env = {**os.environ, "PYTHONHASHSEED": seed, "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-c", _TRACE_SCRIPT]
    if tty:  # util-linux `script` runs the command under a pseudo-terminal
        cmd = ["script", "-qec", shlex.join(cmd), "/dev/null"]
    out = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2]
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1].strip() for ln in out.stdout.splitlines()}
    assert lines["COLOURED"] == str(tty) and lines["PLAIN_TEXT"] == "True"
    return json.loads(lines["FP"])


@pytest.mark.skipif(shutil.which("script") is None, reason="needs util-linux script")
def test_equal_under_a_terminal_a_pipe_and_other_hash_seeds(gpt) -> None:
    piped = _traced_fingerprints("1", tty=False)
    in_terminal = _traced_fingerprints("2", tty=True)
    assert piped == in_terminal
    assert piped[1] == piped[2]  # the two blocks
    same_here = zoo.build("gpt", **(SMALL | {"num_layers": 2}))
    assert [layer.fingerprint for layer in same_here.layers] == piped
