"""A received spec is checked: dataflow (schemas, no jax) and programs (workers.compose)."""

import base64

import jax
import jax.numpy as jnp
import pydantic
import pytest

import client
import schemas.model
from schemas import ModelSpec
from workers.compose import check_programs


def _loss(p: dict, b: dict) -> jnp.ndarray:
    with client.layer("a"):
        h = jnp.tanh(b["x"] @ p["a"])
    with client.layer("b"):
        g = jnp.tanh(h @ p["b"])
    with client.layer("c"):
        return jnp.mean((g + h) @ p["c"])


@pytest.fixture(scope="module")
def doc() -> dict:
    params = {k: jnp.ones((4, 4)) * 0.1 for k in "abc"}
    spec = client.trace(_loss, params, {"x": jnp.ones((2, 4))})
    return spec.model_dump()


def rejected(doc: dict, message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=message):
        ModelSpec.model_validate(doc)


def test_a_traced_spec_is_valid(doc: dict) -> None:
    spec = ModelSpec.model_validate(doc)
    assert schemas.model.dataflow_errors(spec) == []
    assert check_programs(spec) == []


def test_input_not_produced_earlier(doc: dict) -> None:
    bad = {**doc, "layers": [dict(doc["layers"][0]), *doc["layers"][1:]]}
    bad["layers"][0]["inputs"] = [{"name": "h7", "shape": [2, 4], "dtype": "float32"}]
    rejected(bad, r"layers\[0\].inputs\[0\]: 'h7' is not produced by any earlier layer")


def test_input_from_a_later_layer(doc: dict) -> None:
    layers = [dict(layer) for layer in doc["layers"]]
    layers[1]["inputs"] = layers[1]["inputs"] + [layers[2]["outputs"][0]]
    rejected({**doc, "layers": layers}, r"layers\[1\].inputs\[1\]: 'loss' is not produced")


def test_shape_disagrees_with_producer(doc: dict) -> None:
    layers = [dict(layer) for layer in doc["layers"]]
    layers[1]["inputs"] = [{**layers[1]["inputs"][0], "shape": [2, 5]}]
    rejected(
        {**doc, "layers": layers},
        r"layers\[1\].inputs\[0\]: 'a:0' is declared float32\[2, 5\] but "
        r"layers\[0\].outputs\[0\] produces float32\[2, 4\]",
    )


def test_var_produced_twice(doc: dict) -> None:
    layers = [dict(layer) for layer in doc["layers"]]
    layers[1]["inputs"] = []
    layers[1]["outputs"] = [{**layers[1]["outputs"][0], "name": "a:0"}]
    rejected(
        {**doc, "layers": layers},
        r"layers\[1\].outputs\[0\]: 'a:0' is already produced by layers\[0\].outputs\[0\]",
    )
    layers[1]["outputs"] = [{**layers[1]["outputs"][0], "name": "x"}]
    rejected({**doc, "layers": layers}, r"'x' is already produced by inputs\[0\]")


def test_loss_must_be_a_scalar(doc: dict) -> None:
    layers = [dict(layer) for layer in doc["layers"]]
    layers[2]["outputs"] = [{**layers[2]["outputs"][0], "shape": [2]}]
    rejected(
        {**doc, "layers": layers}, r"layers\[2\].outputs\[0\]: the loss 'loss' must be a scalar"
    )


def test_param_clashes(doc: dict) -> None:
    layers = [dict(layer) for layer in doc["layers"]]
    layers[1]["params"] = [{**layers[1]["params"][0], "name": "x"}]
    rejected({**doc, "layers": layers}, r"layers\[1\].params\[0\]: 'x' is also the name of inputs")
    layers[1]["params"] = [{**layers[1]["params"][0], "name": "a", "shape": [4, 5]}]
    rejected({**doc, "layers": layers}, r"layers\[1\].params\[0\]: shared parameter 'a'")


def test_programs_over_the_size_limit(doc: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schemas.model, "MAX_MODEL_PROGRAM_CHARS", 100)
    rejected(doc, r"layers: the programs total \d+ characters, over the limit of 100")


def test_all_violations_are_reported(doc: dict) -> None:
    layers = [dict(layer) for layer in doc["layers"]]
    layers[0]["inputs"] = [{"name": "nope", "shape": [2, 4], "dtype": "float32"}]
    layers[2]["outputs"] = [{**layers[2]["outputs"][0], "shape": [3]}]
    rejected({**doc, "layers": layers}, r"layers\[0\].inputs\[0\].*; layers\[2\].outputs\[0\]")


def test_program_signature_mismatch(doc: dict) -> None:
    layers = [dict(layer) for layer in doc["layers"]]
    # Layer c's program (3 arguments, a scalar out) declared with layer a's signature.
    layers[0]["program"] = doc["layers"][2]["program"]
    spec = ModelSpec.model_validate({**doc, "layers": layers})
    assert check_programs(spec) == [
        "layers[0].program: takes 3 arguments but params + inputs declare 2",
        "layers[0].program: output 0 has shape () but outputs[0] declares (2, 4)",
    ]


def test_program_argument_mismatch(doc: dict) -> None:
    layers = [dict(layer) for layer in doc["layers"]]
    # Layers a and b share a signature except for the input dtype declared here.
    layers[1]["program"] = doc["layers"][0]["program"]
    assert check_programs(ModelSpec.model_validate({**doc, "layers": layers})) == []
    layers[0]["params"] = [{**layers[0]["params"][0], "dtype": "float16"}]
    spec = ModelSpec.model_validate({**doc, "layers": layers})
    assert check_programs(spec) == [
        "layers[0].program: argument 0 has dtype float32 but params[0] declares float16"
    ]


def test_program_for_another_platform(doc: dict) -> None:
    exported = jax.export.export(jax.jit(lambda w, x: (jnp.tanh(x @ w),)), platforms=["tpu"])(
        jax.ShapeDtypeStruct((4, 4), jnp.float32), jax.ShapeDtypeStruct((2, 4), jnp.float32)
    )
    layers = [dict(layer) for layer in doc["layers"]]
    layers[0]["program"] = base64.b64encode(exported.serialize(vjp_order=1)).decode()
    errors = check_programs(ModelSpec.model_validate({**doc, "layers": layers}))
    assert errors == ["layers[0].program: exported for ['tpu'], not for this worker's 'cpu'"]


def test_program_not_a_program(doc: dict) -> None:
    layers = [dict(layer) for layer in doc["layers"]]
    layers[0]["program"] = "not base64!"
    layers[1]["program"] = base64.b64encode(b"\x00" * 64).decode()
    spec = ModelSpec.model_validate({**doc, "layers": layers})
    errors = check_programs(spec)
    assert errors[0].startswith("layers[0].program: not valid base64")
    assert errors[1].startswith("layers[1].program: cannot be deserialized by jax.export")
