"""The zoo models the server accepts in `{"zoo": ...}` plan requests, as data.

The server never imports `client.zoo` (it imports jax); this catalog mirrors its names,
override keys with their types, and preset names, and tests/server/test_zoo_catalog.py
checks that the two agree. The runner builds the spec and applies the zoo's own checks.
"""

from dataclasses import dataclass
from typing import Any

MAX_OVERRIDE_INT = 2**24


@dataclass(frozen=True)
class ZooEntry:
    description: str
    overrides: dict[str, str]  # key -> "int" | "float" | "bool" | "str"
    presets: tuple[str, ...] = ()


_TRANSFORMER = {
    "num_layers": "int",
    "hidden_size": "int",
    "num_heads": "int",
    "seq_len": "int",
    "vocab_size": "int",
    "batch_size": "int",
}

ZOO: dict[str, ZooEntry] = {
    "mlp": ZooEntry(
        description="The seeds' MLP: dense 2048→8192, relu, dense 8192→2048, relu; MSE.",
        overrides={
            "num_layers": "int",
            "hidden_size": "int",
            "ffn_size": "int",
            "batch_size": "int",
        },
        presets=("seed", "tiny"),
    ),
    "gpt": ZooEntry(
        description="GPT: embedding, pre-LN transformer blocks, LM head + loss.",
        overrides=dict(_TRANSFORMER),
        presets=("125M", "350M", "760M", "1.3B", "2.6B", "6.7B", "15B", "39B", "76B"),
    ),
    "moe": ZooEntry(
        description="MoE transformer: attention blocks alternating top-2 MoE and dense FFNs.",
        overrides=_TRANSFORMER | {"num_experts": "int", "expert_group_size": "int"},
        presets=("380M", "690M", "1.3B", "2.4B", "7.1B", "10B", "27B", "70B", "140B"),
    ),
    "wresnet": ZooEntry(
        description="Wide-ResNet: stem, residual blocks (bottleneck × width_factor), dense head.",
        overrides={
            "num_layers": "int",
            "image_size": "int",
            "num_channels": "int",
            "width_factor": "int",
            "num_classes": "int",
            "batch_size": "int",
        },
        presets=("250M", "500M", "1B", "2B", "4B", "6.8B", "13B"),
    ),
}


def _check_value(kind: str, value: Any) -> str | None:
    """Why `value` is not a valid `kind` override, or None."""
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer, got {value!r}"
        if not 1 <= value <= MAX_OVERRIDE_INT:
            return f"must be in [1, {MAX_OVERRIDE_INT}], got {value}"
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, got {value!r}"
    elif kind == "bool" and not isinstance(value, bool):
        return f"must be true or false, got {value!r}"
    elif kind == "str" and not isinstance(value, str):
        return f"must be a string, got {value!r}"
    return None


def zoo_errors(name: str, config: dict[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    """(path under `zoo`, reason) for every problem of a zoo request; empty when valid."""
    entry = ZOO.get(name)
    if entry is None:
        return [(("name",), f"unknown zoo model {name!r}; one of {sorted(ZOO)}")]
    errors: list[tuple[tuple[str, ...], str]] = []
    allowed = sorted(entry.overrides) + ["preset"]
    for key, value in config.items():
        if key == "preset":
            if value not in entry.presets:
                reason = f"unknown preset {value!r} for {name}; one of {list(entry.presets)}"
                errors.append((("config", key), reason))
            continue
        kind = entry.overrides.get(key)
        if kind is None:
            reason = f"{name} has no override {key!r}; allowed: {', '.join(allowed)}"
            errors.append((("config", key), reason))
            continue
        problem = _check_value(kind, value)
        if problem:
            errors.append((("config", key), problem))
    return errors
