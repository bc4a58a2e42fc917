"""client.trace on scans over stacked parameters: each iteration is a layer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import client
import programs
from tests.client.helpers import assert_roundtrip

D, L, B = 16, 4, 2  # hidden, blocks, batch


def block(x: jax.Array, p: dict) -> jax.Array:
    return x + jnp.tanh(x @ p["w"] + p["b"])


def make_params(stacked: bool) -> dict:
    keys = jax.random.split(jax.random.key(0), L + 2)
    blocks = [
        {"b": 0.1 * jax.random.normal(k, (D,)), "w": jax.random.normal(k, (D, D)) / D**0.5}
        for k in keys[:L]
    ]
    params: dict = {
        "embed": jax.random.normal(keys[L], (D, D)) / D**0.5,
        "out": jax.random.normal(keys[L + 1], (D, 4)),
    }
    params["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs), *blocks) if stacked else blocks
    return params


BATCH = {"x": jax.random.normal(jax.random.key(9), (B, D))}
STACKED = {"blocks/b": 0, "blocks/w": 0}


def head(x: jax.Array, p: dict) -> jax.Array:
    with client.layer("head"):
        return jnp.mean((x @ p["out"]) ** 2)


def scanned_loss(p: dict, b: dict) -> jax.Array:
    with client.layer("embed"):
        x = b["x"] @ p["embed"]
    x, _ = jax.lax.scan(lambda h, q: (block(h, q), None), x, p["blocks"])
    return head(x, p)


def unrolled_loss(p: dict, b: dict) -> jax.Array:
    with client.layer("embed"):
        x = b["x"] @ p["embed"]
    for i, q in enumerate(p["blocks"]):
        with client.layer(f"block{i}"):
            x = block(x, q)
    return head(x, p)


@pytest.fixture(scope="module")
def scanned() -> tuple:
    params = make_params(stacked=True)
    return client.trace(scanned_loss, params, BATCH), params


def test_each_iteration_is_a_layer_of_slices(scanned) -> None:
    spec, _ = scanned
    names = ["embed", *(f"blocks/{i}" for i in range(L)), "head"]
    assert [layer.name for layer in spec.layers] == names
    for i, layer in enumerate(spec.layers[1:-1]):
        assert [(p.name, p.shape) for p in layer.params] == [
            (f"blocks/b[{i}]", (D,)),
            (f"blocks/w[{i}]", (D, D)),
        ]
        assert "scan" not in layer.jaxpr
    # the carry is the activation between layers
    assert spec.layers[2].inputs[0].name == spec.layers[1].outputs[0].name
    # one export shared by every iteration
    blocks = spec.layers[1:-1]
    assert len({layer.fingerprint for layer in blocks}) == 1
    assert all(layer.forward == blocks[0].forward for layer in blocks)
    assert all(layer.backward == blocks[0].backward for layer in blocks)


def test_chained_iterations_give_the_loss_and_every_slice_gradient(scanned) -> None:
    spec, params = scanned
    assert_roundtrip(spec, scanned_loss, params, BATCH, cuts=(2, 4), stacked=STACKED)


def test_scanned_block_has_the_unrolled_blocks_fingerprint(scanned) -> None:
    spec, _ = scanned
    unrolled = client.trace(unrolled_loss, make_params(stacked=False), BATCH)
    assert [layer.name for layer in unrolled.layers][1] == "block0"
    assert spec.layers[1].fingerprint == unrolled.layers[1].fingerprint
    assert spec.layers[0].fingerprint == unrolled.layers[0].fingerprint
    assert spec.layers[-1].fingerprint == unrolled.layers[-1].fingerprint


def test_layers_group_whole_iterations(scanned) -> None:
    _, params = scanned
    spec = client.trace(scanned_loss, params, BATCH, layers=3)
    assert spec.num_layers == 3
    seen: list[int] = []
    for layer in spec.layers:
        its = sorted({int(p.name.split("[")[1][:-1]) for p in layer.params if "[" in p.name})
        for i in its:  # each iteration whole (both its slices) in one layer
            assert {f"blocks/b[{i}]", f"blocks/w[{i}]"} <= {p.name for p in layer.params}
        seen += its
    assert seen == list(range(L))
    assert_roundtrip(spec, scanned_loss, params, BATCH, cuts=(1,), stacked=STACKED)


def test_scope_patterns_name_the_scan(scanned) -> None:
    _, params = scanned
    whole = client.trace(scanned_loss, params, BATCH, scopes="blocks")
    assert [layer.name for layer in whole.layers] == ["embed", "blocks", "head"]
    assert len(whole.layers[1].params) == 2 * L
    each = client.trace(scanned_loss, params, BATCH, scopes="blocks/*")
    assert [layer.name for layer in each.layers][1:3] == ["blocks/0", "blocks/1"]


@pytest.mark.parametrize("wrap", ["jit", "checkpoint", "reverse"])
def test_scans_inside_jit_and_checkpoint_are_found(wrap: str) -> None:
    def stack(x: jax.Array, blocks: dict) -> jax.Array:
        body = lambda h, q: (block(h, q), None)  # noqa: E731
        return jax.lax.scan(body, x, blocks, reverse=wrap == "reverse")[0]

    wrapped = {"jit": jax.jit(stack), "checkpoint": jax.checkpoint(stack)}.get(wrap, stack)

    def loss(p: dict, b: dict) -> jax.Array:
        with client.layer("embed"):
            x = b["x"] @ p["embed"]
        return head(wrapped(x, p["blocks"]), p)

    params = make_params(stacked=True)
    spec = client.trace(loss, params, BATCH)
    order = range(L - 1, -1, -1) if wrap == "reverse" else range(L)
    assert [layer.name for layer in spec.layers][1:-1] == [f"blocks/{i}" for i in order]
    if wrap == "checkpoint":  # each iteration is checkpointed as the whole scan was
        assert "remat" in spec.layers[1].jaxpr or "checkpoint" in spec.layers[1].jaxpr
    assert_roundtrip(spec, loss, params, BATCH, cuts=(3,), stacked=STACKED)


def test_a_remat_body_stashes_what_vjp_of_the_checkpointed_block_keeps() -> None:
    policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    body = jax.checkpoint(lambda h, q: (block(jnp.sin(h), q), None), policy=policy)

    def loss(p: dict, b: dict) -> jax.Array:
        with client.layer("embed"):
            x = b["x"] @ p["embed"]
        return head(jax.lax.scan(body, x, p["blocks"])[0], p)

    params = make_params(stacked=True)
    spec = client.trace(loss, params, BATCH)
    q0 = jax.tree.map(lambda v: v[0], params["blocks"])

    @jax.jit
    def kept(x: jax.Array, q: dict) -> list:
        _, vjp = jax.vjp(lambda x, q: body(x, q)[0], x, q)
        inputs = {id(x), *(id(v) for v in jax.tree.leaves(q))}
        return [leaf for leaf in jax.tree.leaves(vjp) if id(leaf) not in inputs]

    want = sorted(tuple(r.shape) for r in kept(jnp.ones((B, D)), q0))
    layer = spec.layers[1]
    assert sorted(tuple(r.shape) for r in layer.residuals) == want
    assert want  # the policy saves the dot: something is stashed


def test_a_scan_over_time_stays_inside_its_layer() -> None:
    def loss(p: dict, b: dict) -> jax.Array:
        with client.layer("rnn"):  # a remat'd loop over time, the weights closed over

            @jax.checkpoint
            def rnn(w: jax.Array, xs: jax.Array) -> jax.Array:
                step = lambda h, x_t: (jnp.tanh(h @ w + x_t), None)  # noqa: E731
                return jax.lax.scan(step, jnp.zeros((D,)), xs)[0]

            h = rnn(p["w"], b["x"])
        with client.layer("head"):
            return jnp.sum(h * p["v"])

    params = {"w": jnp.eye(D), "v": jnp.ones((D,))}
    batch = {"x": jnp.ones((5, D))}
    spec = client.trace(loss, params, batch)
    assert [layer.name for layer in spec.layers] == ["rnn", "head"]
    assert "scan" in spec.layers[0].jaxpr
    assert "remat" in spec.layers[0].jaxpr or "checkpoint" in spec.layers[0].jaxpr


def _scan_loss(body, xs_extra=None):  # noqa: ANN001, ANN202
    def loss(p: dict, b: dict) -> jax.Array:
        xs = p["blocks"] if xs_extra is None else (p["blocks"], b[xs_extra])
        x, ys = jax.lax.scan(body, b["x"], xs)
        return jnp.mean(x) + (0.0 if ys is None else jnp.sum(ys))

    return loss


def test_unsupported_scans_are_clear_errors() -> None:
    params = make_params(stacked=True)
    batch = {**BATCH, "scale": jnp.ones((L,))}
    other_xs = _scan_loss(lambda h, a: (block(h, a[0]) * a[1], None), "scale")
    with pytest.raises(
        ValueError, match=r"scan of length 4 over blocks .*float32\[4\].*not a param"
    ):
        client.trace(other_xs, params, batch)
    ys = _scan_loss(lambda h, q: (block(h, q), jnp.sum(h)))
    with pytest.raises(ValueError, match="scan of length 4 over blocks.*per-iteration outputs"):
        client.trace(ys, params, batch)

    @jax.custom_vjp
    def stack(x: jax.Array, blocks: dict) -> jax.Array:
        return jax.lax.scan(lambda h, q: (block(h, q), None), x, blocks)[0]

    stack.defvjp(
        lambda x, bl: (stack(x, bl), (x, bl)), lambda r, g: (g, jax.tree.map(jnp.zeros_like, r[1]))
    )
    with pytest.raises(ValueError, match="inside a custom_vjp.*cannot be layers"):
        client.trace(lambda p, b: jnp.mean(stack(b["x"], p["blocks"])), params, batch)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_apply_grad_updates_slices_as_the_stacked_parameter(optimizer: str) -> None:
    """Slices are separate parameters of the apply_grad module: the optimizer's update of each
    slice equals the slice of the stacked parameter's update."""
    from workers.measure.stage_modules import OPTIMIZERS

    stacked = make_params(stacked=True)["blocks"]["w"]
    grads = [jnp.sin(stacked + t) for t in range(3)]
    opt = OPTIMIZERS[optimizer]()
    whole, whole_state = stacked, opt.init(stacked)
    parts = [stacked[i] for i in range(L)]
    parts_state = opt.init(parts)
    for g in grads:
        update, whole_state = opt.update(g, whole_state, whole)
        whole = whole + update
        updates, parts_state = opt.update([g[i] for i in range(L)], parts_state, parts)
        parts = [p + u for p, u in zip(parts, updates, strict=True)]
    for i in range(L):
        np.testing.assert_allclose(parts[i], whole[i], rtol=1e-6, atol=1e-7)


def test_the_servers_program_checks_accept_a_scanned_spec(scanned) -> None:
    spec, _ = scanned
    assert programs.check_programs(spec) == []
    assert programs.verified(spec).layers == spec.layers  # fingerprints are the programs' own
