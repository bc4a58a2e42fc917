"""The model zoo: the benchmark models as `ModelSpec`s, built through `client.trace`.

`build(name, **overrides)`; `names()`; `preset="..."` picks a published size.
"""

from collections.abc import Mapping
from typing import Any

from client.zoo.base import Built, ZooModel, init_params
from schemas import ModelSpec

__all__ = ["Built", "ZooModel", "build", "get", "init_params", "make", "names", "spec_from_request"]


def _registry() -> dict[str, ZooModel]:
    from client.zoo import gpt, mlp, moe, wresnet

    return {m.name: m for m in (mlp.MODEL, gpt.MODEL, moe.MODEL, wresnet.MODEL)}


def names() -> list[str]:
    """The zoo's model names."""
    return sorted(_registry())


def get(name: str) -> ZooModel:
    """The zoo entry `name`; ValueError listing the names when unknown."""
    registry = _registry()
    if name not in registry:
        raise ValueError(f"unknown zoo model {name!r}; one of {sorted(registry)}")
    return registry[name]


def make(name: str, **overrides: Any) -> Built:
    """The configured model (loss, abstract params and batch, logical axes) without tracing."""
    model = get(name)
    return model.make(model.config(overrides))


def build(
    name: str, remat_variants: tuple[str, ...] = ("full", "dots"), **overrides: Any
) -> ModelSpec:
    """Trace zoo model `name` with `overrides` (validated; `preset=` for published sizes),
    exporting the layers' `remat_variants` too (see `client.trace`)."""
    from client.tracing import trace

    built = make(name, **overrides)
    return trace(
        built.loss_fn,
        built.params,
        built.batch,
        name=name,
        logical_axes=built.logical_axes,
        remat_variants=remat_variants,
    )


def spec_from_request(name: str, config: Mapping[str, Any] | None = None) -> ModelSpec:
    """Resolve a `{"zoo": name, "config": {...}}` request: `build(name, **config)`."""
    return build(name, **dict(config or {}))
