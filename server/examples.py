"""Request examples for the OpenAPI document (a tiny two-layer model, a zoo request)."""

from typing import Any

_PROGRAM = "AAECAwQFBgc="  # placeholder bytes; real specs carry jax.export output

TINY_MODEL: dict[str, Any] = {
    "name": "tiny_mlp",
    "inputs": [{"name": "x", "shape": [4, 8], "dtype": "float32"}],
    "layers": [
        {
            "name": "dense0",
            "inputs": [{"name": "x", "shape": [4, 8], "dtype": "float32"}],
            "outputs": [{"name": "h", "shape": [4, 8], "dtype": "float32"}],
            "params": [{"name": "w0", "shape": [8, 8], "dtype": "float32"}],
            "forward": _PROGRAM,
            "backward": _PROGRAM,
            "residuals": [],
            "saved": ["x"],
            "grad_inputs": [],
            "jaxpr": "{ lambda ; a:f32[8,8] b:f32[4,8]. let c = dot_general b a in (c,) }",
            "flops": 512.0,
            "fingerprint": "example-dense",
        },
        {
            "name": "head",
            "inputs": [{"name": "h", "shape": [4, 8], "dtype": "float32"}],
            "outputs": [{"name": "loss", "shape": [], "dtype": "float32"}],
            "params": [{"name": "w1", "shape": [8, 8], "dtype": "float32"}],
            "forward": _PROGRAM,
            "backward": _PROGRAM,
            "residuals": [{"name": "res0", "shape": [4, 8], "dtype": "float32"}],
            "saved": ["h"],
            "grad_inputs": ["h"],
            "jaxpr": "{ lambda ; a:f32[8,8] b:f32[4,8]. let c = dot_general b a; "
            "d = reduce_sum c in (d,) }",
            "flops": 520.0,
            "fingerprint": "example-head",
        },
    ],
    "loss": "loss",
}

CLUSTER: dict[str, Any] = {"num_hosts": 1, "devices_per_host": 4, "device_kind": "cpu"}

PLAN_EXAMPLES: dict[str, dict[str, Any]] = {
    "zoo": {
        "summary": "A zoo model with overrides",
        "value": {
            "zoo": {"name": "gpt", "config": {"num_layers": 4, "hidden_size": 64}},
            "cluster": CLUSTER,
            "options": {"num_microbatches": 4},
        },
    },
    "zoo_short": {
        "summary": 'The short zoo form: {"zoo": name, "config": {...}}',
        "value": {"zoo": "mlp", "config": {"preset": "tiny"}, "cluster": CLUSTER},
    },
    "stored": {
        "summary": "A stored model by id",
        "value": {
            "model_id": "3f1c…(the id POST /v1/models returned)",
            "cluster": CLUSTER,
            "options": {"num_microbatches": 8, "strategies": ["data", "megatron"]},
        },
    },
    "inline": {
        "summary": "An inline model spec",
        "value": {"model": TINY_MODEL, "cluster": CLUSTER, "options": {"num_microbatches": 2}},
    },
}

MODEL_EXAMPLES: dict[str, dict[str, Any]] = {
    "tiny": {"summary": "A two-layer model", "value": TINY_MODEL},
}
