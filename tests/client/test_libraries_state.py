"""A Flax NNX model with dropout whose whole state (`nnx.split(model)`) is passed as params:
its PRNG key and counter leaves are carried, not trained, or refused by name (issue 36)."""

from typing import Any

import jax
import numpy as np

import client
from client.tracing import path_name
from tests.client.helpers import composed_loss_and_grads
from tests.client.test_libraries import assert_embed_blocks_head
from tests.support.library_models import BLOCKS, float_leaves, nnx_dropout


def _value_and_float_grads(built: Any) -> tuple[float, dict[str, np.ndarray]]:
    """`jax.value_and_grad` of the loss with respect to the float leaves only (the others,
    keys and counters, held fixed), gradients by spec name."""
    paths, leaves = zip(*jax.tree_util.tree_flatten_with_path(built.params)[0], strict=True)
    treedef = jax.tree_util.tree_structure(built.params)
    floats = float_leaves(built.params)
    names = [path_name(p) for p in paths]
    trained = [i for i, n in enumerate(names) if floats[n]]

    def loss_of_floats(values: list[jax.Array]) -> jax.Array:
        full = list(leaves)
        for i, v in zip(trained, values, strict=True):
            full[i] = v
        return built.loss_fn(jax.tree_util.tree_unflatten(treedef, full), built.batch)

    value, grads = jax.jit(jax.value_and_grad(loss_of_floats))([leaves[i] for i in trained])
    return float(value), {names[i]: np.asarray(g) for i, g in zip(trained, grads, strict=True)}


def test_prng_keys_among_the_params_are_carried_untrained_or_refused_by_name() -> None:
    built = nnx_dropout()
    floats = float_leaves(built.params)
    state = sorted(n for n, is_float in floats.items() if not is_float)
    assert any(n.endswith("rngs/key/value") for n in state), state
    try:
        spec = client.trace(built.loss_fn, built.params, built.batch, remat_variants=())
    except ValueError as err:  # a refusal: it names a key leaf and says what to pass instead
        message = str(err)
        assert any(n in message for n in state), message
        assert "nnx.Param" in message or "pass" in message, message
        return
    assert_embed_blocks_head(spec, BLOCKS)
    carried = {p.name for layer in spec.layers for p in layer.params} & set(state)
    for layer in spec.layers:  # a key or counter is never a differentiated input
        assert not set(layer.grad_inputs) & set(state), layer.name
    value, grads = composed_loss_and_grads(spec, built.params, built.batch, cuts=(1, 3))
    expected, expected_grads = _value_and_float_grads(built)
    np.testing.assert_allclose(value, expected, rtol=1e-4)
    for name, want in expected_grads.items():
        if name in grads:
            tol = 1e-5 + 1e-4 * float(np.max(np.abs(want), initial=0.0))
            np.testing.assert_allclose(grads[name], want, rtol=1e-4, atol=tol, err_msg=name)
    assert {n for n in expected_grads if np.any(expected_grads[n])} <= set(grads)
    for name in carried:  # carried, not trained: no gradient, or an all-zero one
        assert name not in grads or not np.any(np.asarray(grads[name], np.float32)), name
