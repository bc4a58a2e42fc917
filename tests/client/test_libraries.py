"""Other libraries' own model classes (transformers, equinox, dm-haiku, penzai, plain JAX, Flax
NNX; tests/support/library_models.py), traced with no markers, come out as a user expects:
the embedding, one layer per block (all one fingerprint), the head; their exported programs,
chained stage by stage, give back `jax.value_and_grad` of the loss (issue 36)."""

from functools import cache

import jax
import numpy as np
import pytest

import client
from planner.candidates import enumerate_candidates
from schemas import ClusterSpec, ModelSpec, PlanOptions
from tests.client.helpers import assert_roundtrip
from tests.support.library_models import LIBRARY_MODELS, VOCAB, Built

# Every model whose params are float arrays only (nnx_dropout carries PRNG keys:
# tests/client/test_libraries_state.py).
MODELS = [name for name in LIBRARY_MODELS if name != "nnx_dropout"]


@cache
def traced(name: str) -> tuple[Built, ModelSpec]:
    """The model `name`, built and traced once per test process (as written: no remat)."""
    built = LIBRARY_MODELS[name].build()
    spec = client.trace(built.loss_fn, built.params, built.batch, name=name, remat_variants=())
    return built, spec


def describe(spec: ModelSpec) -> str:
    return ", ".join(f"{layer.name} ({layer.fingerprint[:6]})" for layer in spec.layers)


# penzai without a layer stack: its first block transposes the embedding's layout before
# running as the others do, so it is a block of its own computation (the layer stack has no
# such transpose).
FIRST_BLOCK_DIFFERS = {"penzai_list"}


def assert_embed_blocks_head(spec: ModelSpec, blocks: int) -> None:
    """`spec` is the embedding, `blocks` layers of one fingerprint, then the head."""
    assert spec.num_layers == blocks + 2, describe(spec)
    fingerprints = [layer.fingerprint for layer in spec.layers]
    alike = fingerprints[2:-1] if spec.name in FIRST_BLOCK_DIFFERS else fingerprints[1:-1]
    assert len(set(alike)) == 1, describe(spec)
    assert fingerprints[0] != fingerprints[1] != fingerprints[-1], describe(spec)
    assert all(layer.flops > 0 for layer in spec.layers[1:-1]), describe(spec)
    # The vocabulary-sized tables are read by the embedding and the head, never by a block.
    vocab = [any(VOCAB in p.shape for p in layer.params) for layer in spec.layers]
    assert vocab[0] and vocab[-1] and not any(vocab[1:-1]), describe(spec)


@pytest.mark.parametrize("name", MODELS)
def test_layers_are_the_embedding_the_blocks_and_the_head(name: str) -> None:
    _, spec = traced(name)
    assert_embed_blocks_head(spec, LIBRARY_MODELS[name].blocks)


@pytest.mark.parametrize("name", MODELS)
def test_chained_programs_equal_value_and_grad(name: str) -> None:
    """Stages cut after the embedding, mid-way and before the head: the forward programs,
    then the backward programs from their stashes, give the loss and every gradient."""
    built, spec = traced(name)
    last = spec.num_layers - 1
    cuts = tuple(sorted({c for c in (1, spec.num_layers // 2, last) if 0 < c <= last}))
    stacked = LIBRARY_MODELS[name].stacked(built.params)
    assert_roundtrip(spec, built.loss_fn, built.params, built.batch, cuts=cuts, stacked=stacked)


@pytest.mark.parametrize("name", MODELS)
def test_a_loss_jax_has_traced_before_gives_the_same_layers(name: str) -> None:
    """JAX's trace cache must not strip the scopes: the same loss traced, jitted, then traced
    again gives the same layers, and a fresh build jitted before its first trace too."""
    built = LIBRARY_MODELS[name].build()
    first = client.trace(built.loss_fn, built.params, built.batch, name=name, remat_variants=())
    jax.jit(built.loss_fn)(built.params, built.batch)
    again = client.trace(built.loss_fn, built.params, built.batch, name=name, remat_variants=())
    fresh = LIBRARY_MODELS[name].build()
    jax.jit(fresh.loss_fn)(fresh.params, fresh.batch)
    jitted_first = client.trace(
        fresh.loss_fn, fresh.params, fresh.batch, name=name, remat_variants=()
    )
    want = [(layer.name, layer.fingerprint) for layer in first.layers]
    assert [(layer.name, layer.fingerprint) for layer in again.layers] == want
    assert [(layer.name, layer.fingerprint) for layer in jitted_first.layers] == want
    assert_embed_blocks_head(jitted_first, LIBRARY_MODELS[name].blocks)


def _candidates(spec: ModelSpec) -> int:
    cluster = ClusterSpec(num_hosts=1, devices_per_host=2)
    return len(enumerate_candidates(spec, cluster, PlanOptions()).keys)


def test_the_equinox_model_has_about_as_many_candidates_as_gpt2() -> None:
    """A block is one layer whatever library wrote it: the equinox GPT (blocks in a list, a
    scope per `eqx.nn` call) plans over about as many stage candidates as transformers'
    GPT-2 of the same size, not one per `eqx.nn` call (194 on a 1x2 cluster before)."""
    gpt2, eqx = _candidates(traced("hf_gpt2")[1]), _candidates(traced("equinox_gpt")[1])
    assert eqx <= 1.25 * gpt2, (eqx, gpt2)


@pytest.mark.parametrize("name", ["hf_gpt2", "equinox_gpt", "jax_scan", "penzai_stack"])
@pytest.mark.parametrize("num_layers", [3, 4])
def test_layers_n_groups_whole_blocks(name: str, num_layers: int) -> None:
    """`layers=N` cuts only where the per-block spec has a boundary, and every group of the
    same number of whole blocks has one fingerprint."""
    built, per_block = traced(name)
    assert_embed_blocks_head(per_block, LIBRARY_MODELS[name].blocks)
    spec = client.trace(
        built.loss_fn, built.params, built.batch, layers=num_layers, remat_variants=()
    )
    assert spec.num_layers == num_layers, describe(spec)
    bounds = np.cumsum([0.0] + [layer.flops for layer in per_block.layers])
    block_flops = per_block.layers[1].flops
    groups: dict[int, set[str]] = {}
    total = 0.0
    for layer in spec.layers:
        total += layer.flops
        assert np.isclose(bounds, total, rtol=1e-9).any(), (
            f"a cut inside a block: {total} not in {bounds}"
        )
        if not any(VOCAB in p.shape for p in layer.params):  # whole blocks only
            count = layer.flops / block_flops
            assert np.isclose(count, round(count)), (layer.name, count)
            groups.setdefault(round(count), set()).add(layer.fingerprint)
    assert groups, describe(spec)
    assert all(len(fps) == 1 for fps in groups.values()), (groups, describe(spec))
