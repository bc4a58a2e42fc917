"""Collective bytes counted from HLO text."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from workers.measure.hlo_stats import COLLECTIVE_KINDS, collective_bytes, shape_bytes

HLO = """
ENTRY %main {
  %p0 = f32[4,16]{1,0} parameter(0)
  %all-reduce = f32[4,16]{1,0} all-reduce(%p0), channel_id=1, replica_groups={{0,1}}, to_apply=%add
  %fusion = f32[] fusion(%all-reduce), kind=kLoop, calls=%fused
  %ag = bf16[8,16]{1,0} all-gather(%p1), channel_id=2, dimensions={0}
  %rs = (f32[2,16]{1,0}, s32[4]{0}) reduce-scatter(%a, %b), dimensions={0}
  %ags = (f32[4]{0}, f32[16]{0}) all-gather-start(%c), dimensions={0}
  %agd = f32[16]{0} all-gather-done(%ags)
  %cp = pred[8]{0} collective-permute(%d), source_target_pairs={{0,1},{1,0}}
  ROOT %a2a = f16[2,2]{1,0} all-to-all(%e), dimensions={0}
}
"""


def test_shape_bytes_of_arrays_and_tuples() -> None:
    assert shape_bytes("f32[4,16]{1,0}") == 256
    assert shape_bytes("(f32[2,16]{1,0}, s32[4]{0})") == 128 + 16
    assert shape_bytes("f32[]") == 4
    assert shape_bytes("token[]") == 0


def test_collective_bytes_counts_each_kind_once() -> None:
    out = collective_bytes(HLO)
    assert set(out) == set(COLLECTIVE_KINDS)
    assert out["all-reduce"] == 4 * 16 * 4
    # the sync all-gather (bf16) plus the async pair counted once, by its -done result
    assert out["all-gather"] == 8 * 16 * 2 + 16 * 4
    assert out["reduce-scatter"] == 2 * 16 * 4 + 4 * 4
    assert out["collective-permute"] == 8
    assert out["all-to-all"] == 8


def test_compiled_sharded_matmul_has_an_all_reduce() -> None:
    mesh = Mesh(np.asarray(jax.devices()[:2]).reshape(1, 2), ("data", "model"))
    w = jax.ShapeDtypeStruct(
        (16, 8), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec("model"))
    )
    x = jax.ShapeDtypeStruct(
        (4, 16), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec(None, "model"))
    )
    out = NamedSharding(mesh, PartitionSpec())
    compiled = jax.jit(lambda a, b: a @ b, out_shardings=out).lower(x, w).compile()
    counted = collective_bytes(compiled.as_text())
    assert counted["all-reduce"] == 4 * 8 * 4
    assert sum(counted.values()) == counted["all-reduce"]
