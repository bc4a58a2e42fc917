"""What a user imports: trace a JAX or Flax loss into a `ModelSpec`, export its layers, the model
zoo, the HTTP SDK (`client.sdk`). The command line is the `cli` package.

Heavy parts (jax) are imported lazily so `import client` stays light.
"""

import importlib
from typing import Any

# Public name -> module defining it; imported on first use (PEP 562) so jax loads lazily.
_LAZY = {"trace": "client.tracing", "layer": "client.layers"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "zoo":
        return importlib.import_module("client.zoo")
    raise AttributeError(f"module 'client' has no attribute {name!r}")
