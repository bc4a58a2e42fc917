"""Workers tests run JAX on 8 virtual CPU devices (set before jax is imported)."""

import os
import re

NUM_DEVICES = 8

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_force_host_platform_device_count={NUM_DEVICES}"
elif int(re.search(r"device_count=(\d+)", _flags).group(1)) < NUM_DEVICES:  # type: ignore[union-attr]
    os.environ["XLA_FLAGS"] = re.sub(r"device_count=\d+", f"device_count={NUM_DEVICES}", _flags)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
