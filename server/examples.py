"""Request examples for the OpenAPI document (a tiny two-layer model, a zoo request)."""

import json
from pathlib import Path
from typing import Any

# A two-layer MLP with real jax.export programs (the server checks every program it is
# sent); written by scripts/make_example_model.py. Its fingerprints are left to the server.
TINY_MODEL: dict[str, Any] = json.loads(
    (Path(__file__).with_name("example_model.json")).read_text(encoding="utf-8")
)

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
