"""Round-trip checks shared by the client and compose tests."""

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from client.tracing import path_name
from schemas import ModelSpec
from workers.measure.compose import compose_stage


def by_name(tree: Any, stacked: Mapping[str, int] | None = None) -> dict[str, jax.Array]:
    """A params pytree as {spec param name: value}; `stacked` (name: layer axis) adds each
    scanned-over parameter's slices, `name[i]`, as a scanned spec names them."""
    named = {path_name(p): v for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}
    for name, axis in (stacked or {}).items():
        value = named[name]
        for i in range(value.shape[axis]):
            named[f"{name}[{i}]"] = jax.numpy.take(value, i, axis=axis)
    return named


def composed_loss_and_grads(
    spec: ModelSpec,
    params: Any,
    batch: dict[str, jax.Array],
    cuts: tuple[int, ...] = (),
    stacked: Mapping[str, int] | None = None,
) -> tuple[float, dict[str, np.ndarray]]:
    """Loss and gradients of the spec run as stages split before each layer in `cuts`: every
    stage's forward (keeping its stash), then every stage's backward in reverse, from the
    stash (as a pipeline runs them; no autodiff of the exported programs)."""
    bounds = [0, *cuts, spec.num_layers]
    stages = [compose_stage(spec, lo, hi - 1) for lo, hi in zip(bounds, bounds[1:], strict=False)]
    names = list(dict.fromkeys(p.name for s in stages for p in s.params))
    named = by_name(params, stacked)

    def loss_and_grads(values: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
        env = dict(zip(names, values, strict=True)) | dict(batch)
        stashes = []
        for stage in stages:
            outs, stash = stage.forward(
                [env[p.name] for p in stage.params], [env[v.name] for v in stage.inputs]
            )
            env.update(zip((v.name for v in stage.outputs), outs, strict=True))
            stashes.append(stash)
        ct: dict[str, jax.Array] = {spec.loss: jax.numpy.ones((), env[spec.loss].dtype)}
        grads: dict[str, jax.Array] = {}
        for stage, stash in zip(reversed(stages), reversed(stashes), strict=True):
            cts = [
                ct.get(stage.outputs[i].name, jax.numpy.zeros_like(env[stage.outputs[i].name]))
                for i in stage.diff_outputs
            ]
            gp, gx = stage.backward([env[p.name] for p in stage.params], stash, cts)
            for p, g in zip(stage.params, gp, strict=True):
                grads[p.name] = grads[p.name] + g if p.name in grads else g
            for j, g in zip(stage.grad_inputs, gx, strict=True):
                n = stage.inputs[j].name
                ct[n] = ct[n] + g if n in ct else g
        return env[spec.loss], [grads[n] for n in names]

    value, grads = jax.jit(loss_and_grads)([named[n] for n in names])
    return float(value), {n: np.asarray(g) for n, g in zip(names, grads, strict=True)}


def assert_roundtrip(
    spec: ModelSpec,
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: dict[str, jax.Array],
    cuts: tuple[int, ...] = (),
    rtol: float = 1e-4,
    atol: float = 1e-5,
    stacked: Mapping[str, int] | None = None,
) -> None:
    """The composed spec's loss and gradients equal `loss_fn`'s (every used param checked;
    a stacked parameter's gradient slice by slice, see `by_name`)."""
    value, grads = composed_loss_and_grads(spec, params, batch, cuts, stacked)
    expected, expected_grads = jax.jit(jax.value_and_grad(loss_fn))(params, batch)
    np.testing.assert_allclose(value, float(expected), rtol=rtol, atol=atol)
    expected_named = by_name(expected_grads, stacked)
    assert grads, "the spec has no parameters"
    for name, g in grads.items():
        want = np.asarray(expected_named[name])
        # Float32 sums reorder across layer boundaries: allow rtol of the gradient's scale.
        tol = atol + rtol * float(np.max(np.abs(want), initial=0.0))
        np.testing.assert_allclose(g, want, rtol=rtol, atol=tol, err_msg=name)
