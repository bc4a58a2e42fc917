"""Deserialize base64 `jax.export` programs, cached by their text."""

import base64
import functools

import jax

from schemas import LayerSpec


@functools.lru_cache(maxsize=1024)
def load_program(text: str) -> jax.export.Exported:
    """`jax.export.deserialize` of base64 text, cached by the text. Raises
    `binascii.Error`/`ValueError` for bad base64 and whatever jax raises for bytes that are
    not a serialized export."""
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    return jax.export.deserialize(bytearray(raw))


def load_layer(layer: LayerSpec) -> tuple[jax.export.Exported, jax.export.Exported]:
    """A layer's forward and backward, deserialized."""
    return load_program(layer.forward), load_program(layer.backward)
