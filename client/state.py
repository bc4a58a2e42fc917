"""Params leaves a layer cannot take, refused by name before tracing.

A PRNG key (an extended dtype such as `key<fry>`, e.g. the dropout key in a Flax NNX state
split whole) cannot be a parameter: the spec's programs take arrays of named dtypes, and a
parameter is trained (every stage computes its gradient and the optimizer updates it),
which a key is not. The message names the leaf and says what to pass instead.
"""

from typing import Any

import jax
import numpy as np

from schemas import DTYPE_BYTES

_INSTEAD = (
    "pass only the trained parameters as params and close over the rest (Flax NNX: "
    "`graphdef, params, rest = nnx.split(model, nnx.Param, ...)`, then "
    "`nnx.merge(graphdef, params, rest)` inside loss_fn; equinox: "
    "`eqx.partition(model, eqx.is_inexact_array)`), or pass a key in the batch as "
    "`jax.random.key_data(key)` and rewrap it with `jax.random.wrap_key_data`"
)


def check_params(leaves: list[Any], names: list[str]) -> None:
    """Raise `ValueError` naming the first leaf that is a PRNG key or not an array of a
    dtype the spec can name."""
    for leaf, name in zip(leaves, names, strict=True):
        dtype = getattr(leaf, "dtype", None)
        if dtype is None and isinstance(leaf, int | float | bool):
            continue  # a Python number: traced as a weakly typed scalar
        if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            raise ValueError(
                f"params leaf {name!r} is a PRNG key ({dtype}), state that is not trained; "
                + _INSTEAD
            )
        try:
            ok = dtype is not None and np.dtype(dtype).name in DTYPE_BYTES
        except TypeError:
            ok = False
        if not ok:
            raise ValueError(
                f"params leaf {name!r} has type {dtype or type(leaf).__name__}; a parameter "
                f"is an array of one of {sorted(DTYPE_BYTES)}: " + _INSTEAD
            )
