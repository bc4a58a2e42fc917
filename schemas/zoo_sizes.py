"""The zoo's sizes as data, the one copy: each model's description, defaults and published
presets, and Wide-ResNet's blocks per depth. `client.zoo` builds the models from it (with
jax); the server reads it to check a zoo request before queueing it (without jax)."""

from dataclasses import dataclass, field
from typing import Any

Config = dict[str, Any]


@dataclass(frozen=True)
class ZooSizes:
    """A zoo model's description, its defaults (their types are the overrides' types) and
    its named published sizes."""

    description: str
    defaults: Config
    presets: dict[str, Config] = field(default_factory=dict)


def _named(keys: tuple[str, ...], rows: dict[str, tuple[Any, ...]]) -> dict[str, Config]:
    return {name: dict(zip(keys, values, strict=True)) for name, values in rows.items()}


_GPT_KEYS = ("seq_len", "hidden_size", "num_layers", "num_heads", "vocab_size")
_MOE_KEYS = (*_GPT_KEYS, "num_experts", "expert_group_size")
_WRESNET_KEYS = ("image_size", "num_layers", "num_channels", "width_factor")

# Wide-ResNet residual blocks per stage, and whether blocks are bottlenecks (flax / Alpa
# model_configs). 6 is not a published depth: the first two stages of WRN-10, the quick default.
WRESNET_STAGES: dict[int, tuple[tuple[int, ...], bool]] = {
    6: ((1, 1), False),
    10: ((1, 1, 1, 1), False),
    18: ((2, 2, 2, 2), False),
    34: ((3, 4, 6, 3), False),
    50: ((3, 4, 6, 3), True),
    101: ((3, 4, 23, 3), True),
    152: ((3, 8, 36, 3), True),
    200: ((3, 24, 36, 3), True),
}

# Defaults are small, so a first try plans in under a minute on a laptop's CPU; the published
# sizes of Alpa's benchmarks (benchmark/alpa/suite_*.py) are presets.
ZOO_SIZES: dict[str, ZooSizes] = {
    "mlp": ZooSizes(
        description="The seeds' MLP (preset 'seed': 2 layers of dense 2048→8192, relu, dense "
        "8192→2048, relu; MSE); by default 256→1024.",
        defaults={"num_layers": 2, "hidden_size": 256, "ffn_size": 1024, "batch_size": 32},
        presets={
            "seed": {"num_layers": 2, "hidden_size": 2048, "ffn_size": 8192, "batch_size": 128},
            "tiny": {"hidden_size": 32, "ffn_size": 128, "batch_size": 8},
        },
    ),
    "gpt": ZooSizes(
        description="GPT: embedding, num_layers pre-LN transformer blocks, LM head + loss.",
        defaults={
            "num_layers": 2,
            "hidden_size": 64,
            "num_heads": 4,
            "seq_len": 32,
            "vocab_size": 512,
            "batch_size": 8,
        },
        presets=_named(
            _GPT_KEYS,
            {
                "125M": (1024, 768, 12, 12, 51200),
                "350M": (1024, 1024, 24, 16, 51200),
                "760M": (1024, 1536, 24, 16, 51200),
                "1.3B": (1024, 2048, 24, 32, 51200),
                "2.6B": (1024, 2560, 32, 32, 51200),
                "6.7B": (1024, 4096, 32, 32, 51200),
                "15B": (1024, 5120, 48, 40, 51200),
                "39B": (1024, 8192, 48, 64, 51200),
                "76B": (1024, 10240, 60, 80, 51200),
            },
        ),
    ),
    "moe": ZooSizes(
        description="MoE transformer: attention blocks alternating top-2 MoE and dense FFNs.",
        defaults={
            "num_layers": 1,
            "hidden_size": 32,
            "num_heads": 4,
            "seq_len": 16,
            "vocab_size": 256,
            "batch_size": 8,
            "num_experts": 4,
            "expert_group_size": 32,
        },
        presets=_named(
            _MOE_KEYS,
            {
                "380M": (1024, 768, 8, 16, 32000, 8, 2048),
                "690M": (1024, 768, 8, 16, 32000, 16, 2048),
                "1.3B": (1024, 768, 16, 16, 32000, 16, 2048),
                "2.4B": (1024, 1024, 16, 16, 32000, 16, 2048),
                "7.1B": (1024, 1280, 16, 16, 32000, 32, 2048),
                "10B": (1024, 1536, 16, 16, 32000, 32, 2048),
                "27B": (1024, 2048, 16, 16, 32000, 48, 2048),
                "70B": (1024, 2048, 32, 16, 32000, 64, 2048),
                "140B": (1024, 2048, 32, 16, 32000, 128, 2048),
            },
        ),
    ),
    "wresnet": ZooSizes(
        description="Wide-ResNet: stem, residual blocks (bottleneck x width_factor), dense head.",
        defaults={
            "num_layers": 6,
            "image_size": 32,
            "num_channels": 8,
            "width_factor": 1,
            "num_classes": 10,
            "batch_size": 4,
        },
        presets={
            name: config | {"num_classes": 1024}  # Alpa's benchmark uses 1024 classes
            for name, config in _named(
                _WRESNET_KEYS,
                {
                    "250M": (224, 50, 160, 2),
                    "500M": (224, 50, 224, 2),
                    "1B": (224, 50, 320, 2),
                    "2B": (224, 50, 448, 2),
                    "4B": (224, 50, 640, 2),
                    "6.8B": (224, 50, 320, 16),
                    "13B": (224, 101, 320, 16),
                },
            ).items()
        },
    ),
}
