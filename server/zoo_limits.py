"""What a zoo request will build, known before it is queued: sizes, layers, micro-batch.

The runner traces zoo models with `client.zoo` (jax), which the server may not import; both
read the zoo's sizes from `schemas.zoo_sizes`, so the API can refuse, at the door, a zoo
request the runner would fail on: a size over its limit, a model rule (heads dividing the
hidden size, a Wide-ResNet depth), or more stage candidates than the cap.
"""

from typing import Any

from schemas.model import MAX_LAYERS
from schemas.zoo_sizes import WRESNET_STAGES, ZOO_SIZES

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

DEFAULTS: dict[str, dict[str, Any]] = {name: z.defaults for name, z in ZOO_SIZES.items()}
PRESETS: dict[str, dict[str, dict[str, Any]]] = {name: z.presets for name, z in ZOO_SIZES.items()}

# Wide-ResNet residual blocks per depth, and whether they are bottlenecks.
WRESNET_BLOCKS: dict[int, tuple[int, bool]] = {
    depth: (sum(blocks), bottleneck) for depth, (blocks, bottleneck) in WRESNET_STAGES.items()
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
