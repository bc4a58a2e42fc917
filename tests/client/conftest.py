"""Client tests trace on the CPU (one device is enough; set before jax is imported)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
