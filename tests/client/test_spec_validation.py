"""A received spec is checked: dataflow (schemas, no jax) and programs (workers.measure.compose)."""

import base64

import jax
import jax.numpy as jnp
import pydantic
import pytest

import client
import schemas.model
from schemas import ModelSpec
from workers.measure.compose import check_programs


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
    spec = client.trace(_loss, params, {"x": jnp.ones((2, 4))}, remat_variants=())
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
    bad["layers"][0]["saved"] = []
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
    layers[1]["saved"] = []
    layers[1]["grad_inputs"] = []
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
    layers[0]["saved"] = []
    layers[2]["outputs"] = [{**layers[2]["outputs"][0], "shape": [3]}]
    rejected({**doc, "layers": layers}, r"layers\[0\].inputs\[0\].*; layers\[2\].outputs\[0\]")


def test_old_single_program_form_is_refused(doc: dict) -> None:
    layers = [dict(layer) for layer in doc["layers"]]
    old = {k: v for k, v in layers[1].items() if k not in ("forward", "backward", "residuals")}
    layers[1] = {**old, "program": doc["layers"][1]["forward"]}
    rejected({**doc, "layers": layers}, r"layers\.1\n.*old single-program form.*upload it again")


def test_grad_inputs_must_be_the_differentiated_inputs(doc: dict) -> None:
    layers = [dict(layer) for layer in doc["layers"]]
    layers[1]["grad_inputs"] = []
    rejected({**doc, "layers": layers}, r"layers\[1\].grad_inputs: must list .*\['a:0'\]")
    layers[1]["grad_inputs"] = ["nope"]
    rejected({**doc, "layers": layers}, r"grad_inputs names 'nope', which is not a floating input")


def test_program_signature_mismatch(doc: dict) -> None:
    layers = [dict(layer) for layer in doc["layers"]]
    # Layer c's forward (3 arguments, a scalar out) declared with layer a's signature.
    layers[0]["forward"] = doc["layers"][2]["forward"]
    spec = ModelSpec.model_validate({**doc, "layers": layers})
    errors = check_programs(spec)
    assert errors[0] == "layers[0].forward: takes 3 arguments but params + inputs declare 2"
    assert errors[1].startswith("layers[0].forward: output 0 has shape () but outputs[0]")
    assert all(e.startswith("layers[0].forward") for e in errors)


def test_program_argument_mismatch(doc: dict) -> None:
    layers = [dict(layer) for layer in doc["layers"]]
    # Layers a and b have the same forward signature (a's input is not differentiated, so
    # only their backwards differ); the parameter dtype declared here disagrees with both.
    layers[1]["forward"] = doc["layers"][0]["forward"]
    assert check_programs(ModelSpec.model_validate({**doc, "layers": layers})) == []
    layers[1]["backward"] = doc["layers"][0]["backward"]
    assert check_programs(ModelSpec.model_validate({**doc, "layers": layers})) == [
        "layers[1].backward: returns 1 outputs but params + grad_inputs declare 2"
    ]
    layers[1]["backward"] = doc["layers"][1]["backward"]
    layers[0]["params"] = [{**layers[0]["params"][0], "dtype": "float16"}]
    spec = ModelSpec.model_validate({**doc, "layers": layers})
    assert check_programs(spec) == [
        "layers[0].forward: argument 0 has dtype float32 but params[0] declares float16",
        "layers[0].backward: argument 0 has dtype float32 but params[0] declares float16",
        "layers[0].backward: output 0 has dtype float32 but params[0] declares float16",
    ]


def test_program_for_another_platform(doc: dict) -> None:
    exported = jax.export.export(jax.jit(lambda w, x: (jnp.tanh(x @ w),)), platforms=["tpu"])(
        jax.ShapeDtypeStruct((4, 4), jnp.float32), jax.ShapeDtypeStruct((2, 4), jnp.float32)
    )
    layers = [dict(layer) for layer in doc["layers"]]
    layers[0]["forward"] = base64.b64encode(exported.serialize()).decode()
    errors = check_programs(ModelSpec.model_validate({**doc, "layers": layers}))
    assert errors[0] == "layers[0].forward: exported for ['tpu'], not for this worker's 'cpu'"


def test_program_not_a_program(doc: dict) -> None:
    layers = [dict(layer) for layer in doc["layers"]]
    layers[0]["forward"] = "not base64!"
    layers[1]["backward"] = base64.b64encode(b"\x00" * 64).decode()
    spec = ModelSpec.model_validate({**doc, "layers": layers})
    errors = check_programs(spec)
    assert errors[0].startswith("layers[0].forward: not valid base64")
    assert errors[1].startswith("layers[1].backward: cannot be deserialized by jax.export")
