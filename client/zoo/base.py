"""What a zoo model is: defaults, published presets, and a builder of loss, shapes and axes."""

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp

from schemas.model import MAX_LAYERS

Config = dict[str, Any]


@dataclass(frozen=True)
class Built:
    """One configured model: everything `client.trace` needs, plus example data for tests."""

    loss_fn: Callable[[Any, Any], jax.Array]
    params: Any  # pytree of jax.ShapeDtypeStruct
    batch: dict[str, jax.ShapeDtypeStruct]
    logical_axes: Mapping[str, tuple[str | None, ...]]
    sample_batch: Callable[[jax.Array], dict[str, jax.Array]]


@dataclass(frozen=True)
class ZooModel:
    """A zoo entry: `make(config) -> Built`, its defaults and its named published sizes."""

    name: str
    description: str
    defaults: Mapping[str, Any]
    make: Callable[[Config], Built]
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def config(self, overrides: Mapping[str, Any]) -> Config:
        """Defaults, then `preset`'s values, then the other overrides; all keys checked."""
        overrides = dict(overrides)
        preset = overrides.pop("preset", None)
        allowed = sorted(self.defaults) + ["preset"]
        unknown = sorted(set(overrides) - set(self.defaults))
        if unknown:
            raise ValueError(
                f"{self.name}: unknown override(s) {unknown}; allowed: {', '.join(allowed)}"
            )
        config = dict(self.defaults)
        if preset is not None:
            if preset not in self.presets:
                raise ValueError(
                    f"{self.name}: unknown preset {preset!r}; one of {sorted(self.presets)}"
                )
            config.update(self.presets[preset])
        for key, value in overrides.items():
            config[key] = _coerce(self.name, key, value, self.defaults[key])
        # Checked before tracing: a spec has at most MAX_LAYERS layers (with embed and head).
        if config.get("num_layers", 0) > MAX_LAYERS - 2:
            raise ValueError(
                f"{self.name}: num_layers must be at most {MAX_LAYERS - 2}, "
                f"got {config['num_layers']}"
            )
        return config


def _coerce(model: str, key: str, value: Any, default: Any) -> Any:
    kind = type(default)
    if kind is bool and not isinstance(value, bool):
        raise ValueError(f"{model}: {key} must be a bool, got {value!r}")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{model}: {key} must be an int, got {value!r}")
    if kind is int and value < 1:
        raise ValueError(f"{model}: {key} must be >= 1, got {value}")
    if kind is float and not isinstance(value, int | float):
        raise ValueError(f"{model}: {key} must be a number, got {value!r}")
    if kind is str and not isinstance(value, str):
        raise ValueError(f"{model}: {key} must be a string, got {value!r}")
    return kind(value)


def init_params(shapes: Any, key: jax.Array) -> Any:
    """Random values for a pytree of shapes: ones for '*scale', zeros for vectors, else
    normal / sqrt(fan_in)."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    keys = jax.random.split(key, len(leaves))
    values = []
    for (path, s), k in zip(leaves, keys, strict=True):
        last = str(getattr(path[-1], "key", path[-1]))
        if last.endswith("scale"):
            values.append(jnp.ones(s.shape, s.dtype))
        elif len(s.shape) <= 1:
            values.append(jnp.zeros(s.shape, s.dtype))
        else:
            fan_in = math.prod(s.shape[:-1])
            values.append(jax.random.normal(k, s.shape, s.dtype) / math.sqrt(fan_in))
    return jax.tree_util.tree_unflatten(treedef, values)


def f32(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.float32)
