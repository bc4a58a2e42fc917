"""The zoo models the server accepts in `{"zoo": ...}` plan requests, as data.

The server never imports `client.zoo` (it imports jax); the names, override keys with their
types (those of the defaults) and preset names come from `schemas.zoo_sizes`, which the zoo
builds its models from too. The runner builds the spec and applies the zoo's own checks.
"""

from dataclasses import dataclass
from typing import Any

from schemas.zoo_sizes import ZOO_SIZES

MAX_OVERRIDE_INT = 2**24


@dataclass(frozen=True)
class ZooEntry:
    description: str
    overrides: dict[str, str]  # key -> "int" | "float" | "bool" | "str"
    presets: tuple[str, ...] = ()


ZOO: dict[str, ZooEntry] = {
    name: ZooEntry(
        description=z.description,
        overrides={key: type(value).__name__ for key, value in z.defaults.items()},
        presets=tuple(z.presets),
    )
    for name, z in ZOO_SIZES.items()
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
