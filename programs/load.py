"""Deserialize base64 `jax.export` programs, cached by the hash of their text."""

import base64
import hashlib
from collections import OrderedDict

import jax

from schemas import LayerSpec

_CACHE_SIZE = 1024
_cache: OrderedDict[str, jax.export.Exported] = OrderedDict()


def load_program(text: str) -> jax.export.Exported:
    """`jax.export.deserialize` of base64 text. Raises `binascii.Error`/`ValueError` for bad
    base64 and whatever jax raises for bytes that are not a serialized export."""
    key = hashlib.sha256(text.encode("ascii", errors="replace")).hexdigest()
    exported = _cache.get(key)
    if exported is None:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
        exported = jax.export.deserialize(bytearray(raw))
        _cache[key] = exported
        if len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    else:
        _cache.move_to_end(key)
    return exported


def load_layer(layer: LayerSpec) -> tuple[jax.export.Exported, jax.export.Exported]:
    """A layer's forward and backward, deserialized."""
    return load_program(layer.forward), load_program(layer.backward)
