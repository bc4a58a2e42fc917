"""What a zoo request will build, known before it is queued: sizes, layers, micro-batch.

The runner traces zoo models with `client.zoo` (jax), which the server may not import; this
module mirrors the zoo's defaults and presets as data (tests/server/test_admission.py checks
that they agree) so the API can refuse, at the door, a zoo request the runner would fail
on: a size over its limit, a model rule (heads dividing the hidden size, a Wide-ResNet
depth), or more stage candidates than the cap.
"""

from typing import Any

from schemas.model import MAX_LAYERS

# Largest value of each integer override; every published preset fits.
MAX_VALUES: dict[str, int] = {
    "num_layers": MAX_LAYERS - 2,  # a spec has at most MAX_LAYERS layers, embed and head too
    "hidden_size": 65_536,
    "ffn_size": 262_144,
    "num_heads": 1_024,
    "seq_len": 131_072,
    "vocab_size": 1_048_576,
    "batch_size": 65_536,
    "num_experts": 4_096,
    "expert_group_size": 1_048_576,
    "image_size": 8_192,
    "num_channels": 16_384,
    "width_factor": 256,
    "num_classes": 1_048_576,
}

_TRANSFORMER = {
    "num_layers": 2,
    "hidden_size": 64,
    "num_heads": 4,
    "seq_len": 32,
    "vocab_size": 512,
    "batch_size": 8,
}
_MLP_SEED = {"num_layers": 2, "hidden_size": 2048, "ffn_size": 8192, "batch_size": 128}
DEFAULTS: dict[str, dict[str, Any]] = {
    "mlp": {"num_layers": 2, "hidden_size": 256, "ffn_size": 1024, "batch_size": 32},
    "gpt": dict(_TRANSFORMER),
    "moe": _TRANSFORMER
    | {
        "num_layers": 1,
        "hidden_size": 32,
        "seq_len": 16,
        "vocab_size": 256,
        "num_experts": 4,
        "expert_group_size": 32,
    },
    "wresnet": {
        "num_layers": 6,
        "image_size": 32,
        "num_channels": 8,
        "width_factor": 1,
        "num_classes": 10,
        "batch_size": 4,
    },
}

_GPT = ("seq_len", "hidden_size", "num_layers", "num_heads", "vocab_size")
_MOE = (*_GPT, "num_experts", "expert_group_size")
_WRESNET = ("image_size", "num_layers", "num_channels", "width_factor")
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "mlp": {
        "seed": dict(_MLP_SEED),
        "tiny": {"hidden_size": 32, "ffn_size": 128, "batch_size": 8},
    },
    "gpt": {
        name: dict(zip(_GPT, values, strict=True))
        for name, values in {
            "125M": (1024, 768, 12, 12, 51200),
            "350M": (1024, 1024, 24, 16, 51200),
            "760M": (1024, 1536, 24, 16, 51200),
            "1.3B": (1024, 2048, 24, 32, 51200),
            "2.6B": (1024, 2560, 32, 32, 51200),
            "6.7B": (1024, 4096, 32, 32, 51200),
            "15B": (1024, 5120, 48, 40, 51200),
            "39B": (1024, 8192, 48, 64, 51200),
            "76B": (1024, 10240, 60, 80, 51200),
        }.items()
    },
    "moe": {
        name: dict(zip(_MOE, values, strict=True))
        for name, values in {
            "380M": (1024, 768, 8, 16, 32000, 8, 2048),
            "690M": (1024, 768, 8, 16, 32000, 16, 2048),
            "1.3B": (1024, 768, 16, 16, 32000, 16, 2048),
            "2.4B": (1024, 1024, 16, 16, 32000, 16, 2048),
            "7.1B": (1024, 1280, 16, 16, 32000, 32, 2048),
            "10B": (1024, 1536, 16, 16, 32000, 32, 2048),
            "27B": (1024, 2048, 16, 16, 32000, 48, 2048),
            "70B": (1024, 2048, 32, 16, 32000, 64, 2048),
            "140B": (1024, 2048, 32, 16, 32000, 128, 2048),
        }.items()
    },
    "wresnet": {
        name: dict(zip(_WRESNET, values, strict=True)) | {"num_classes": 1024}
        for name, values in {
            "250M": (224, 50, 160, 2),
            "500M": (224, 50, 224, 2),
            "1B": (224, 50, 320, 2),
            "2B": (224, 50, 448, 2),
            "4B": (224, 50, 640, 2),
            "6.8B": (224, 50, 320, 16),
            "13B": (224, 101, 320, 16),
        }.items()
    },
}

# Wide-ResNet residual blocks per depth, and whether they are bottlenecks.
WRESNET_BLOCKS: dict[int, tuple[int, bool]] = {
    6: (2, False),
    10: (4, False),
    18: (8, False),
    34: (16, False),
    50: (16, True),
    101: (33, True),
    152: (50, True),
    200: (66, True),
}

Problems = list[tuple[tuple[str, ...], str]]


def resolve(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """The configuration the runner builds: defaults, then the preset, then the overrides
    (`config` already passed `server.zoo_catalog.zoo_errors`)."""
    resolved = dict(DEFAULTS[name])
    preset = config.get("preset")
    if preset is not None:
        resolved.update(PRESETS[name][preset])
    resolved.update({k: v for k, v in config.items() if k != "preset"})
    return resolved


def size_errors(name: str, config: dict[str, Any]) -> Problems:
    """(path under `zoo`, reason) for sizes over their limit and the model rules the runner
    would fail on, for a request that passed `zoo_errors`."""
    errors: Problems = [
        (("config", key), f"must be at most {MAX_VALUES[key]}, got {value}")
        for key, value in config.items()
        if key in MAX_VALUES and isinstance(value, int) and value > MAX_VALUES[key]
    ]
    if errors:
        return errors
    c = resolve(name, config)
    where = ("config",)
    if name in ("gpt", "moe") and c["hidden_size"] % c["num_heads"]:
        reason = f"hidden_size {c['hidden_size']} must be divisible by num_heads {c['num_heads']}"
        errors.append(((*where, "num_heads"), reason))
    if name == "moe" and (c["batch_size"] * c["seq_len"]) % c["expert_group_size"]:
        tokens = c["batch_size"] * c["seq_len"]
        reason = (
            f"batch_size * seq_len = {tokens} tokens must be a multiple of "
            f"expert_group_size {c['expert_group_size']}"
        )
        errors.append(((*where, "expert_group_size"), reason))
    if name == "wresnet":
        depth = c["num_layers"]
        if depth not in WRESNET_BLOCKS:
            reason = f"wresnet num_layers must be one of {sorted(WRESNET_BLOCKS)}, got {depth}"
            errors.append(((*where, "num_layers"), reason))
        elif not WRESNET_BLOCKS[depth][1] and c["width_factor"] != 1:
            reason = (
                f"must be 1 for {depth} layers (basic blocks), got {c['width_factor']}; "
                "use 50 or more layers for wide bottleneck blocks"
            )
            errors.append(((*where, "width_factor"), reason))
    return errors


def spec_shape(name: str, config: dict[str, Any]) -> tuple[int, int]:
    """(layers of the traced spec, micro-batch size) of a valid zoo request."""
    c = resolve(name, config)
    if name == "mlp":
        layers = c["num_layers"]
    elif name == "wresnet":
        layers = WRESNET_BLOCKS[c["num_layers"]][0] + 2  # stem, blocks, head
    else:
        layers = c["num_layers"] + 2  # embedding, blocks, LM head
    return layers, c["batch_size"]
