"""The seed as a check: Alpa's per-device sizes for the MLP stage (0, 1) on 2 devices, (2,1) data.

`../shared/seeds/000_5fa4ec02fa33ebc2.txt` is Alpa's own output for this candidate; the
forward module's per-device input sizes and the backward module's gradient sizes must match
it (as multisets: Alpa orders its vars by its own jaxpr names).
"""

import re
from pathlib import Path

import pytest

from schemas import (
    ClusterSpec,
    ModelSpec,
    ModuleKind,
    PlanOptions,
    ShardingConfig,
    SubmeshShape,
)
from workers.measure.stage import measure_stage_on

SEED = Path(__file__).resolve().parents[3] / "shared" / "seeds" / "000_5fa4ec02fa33ebc2.txt"
# The same numbers, for checkouts without ../shared (copied from the seed's printed result).
SEED_FORWARD_INVARS = (67108864, 32768, 67108864, 8192, 524288) * 2
SEED_BACKWARD_OUTVARS = (8192, 67108864, 32768, 67108864) * 2
SEED_INITIAL_GB = 0.250


def seed_sizes() -> tuple[list[int], list[int]]:
    """(forward invar_sizes, backward outvar_sizes) from the seed's printed result."""
    if not SEED.exists():
        return list(SEED_FORWARD_INVARS), list(SEED_BACKWARD_OUTVARS)
    text = SEED.read_text()
    result = text[text.index("StageProfileResult(\n") :]
    found = re.findall(r"(invar|outvar)_sizes=\(([\d,\s]+)\)", result)
    sizes = [(kind, [int(v) for v in re.findall(r"\d+", body)]) for kind, body in found]
    forward_in = sizes[0][1]
    backward_out = [v for kind, v in sizes if kind == "outvar"][1]
    return forward_in, backward_out


def test_seed_numbers_are_read() -> None:
    forward_in, backward_out = seed_sizes()
    assert sorted(forward_in) == sorted(SEED_FORWARD_INVARS)
    assert sorted(backward_out) == sorted(SEED_BACKWARD_OUTVARS)


@pytest.mark.slow
def test_mlp_stage_matches_alpas_per_device_sizes() -> None:
    from client import zoo

    spec: ModelSpec = zoo.build("mlp", preset="seed")  # 2 × (2048→8192→2048), batch 128
    r = measure_stage_on(
        spec,
        0,
        1,
        SubmeshShape(hosts=1, devices_per_host=2),
        ShardingConfig(logical_mesh=(2, 1), strategy="data"),
        ClusterSpec(num_hosts=1, devices_per_host=2),
        PlanOptions(optimizer="sgd", repeats=1, warmup=0),  # the seed trained with SGD
    )
    assert r.ok, r.error
    forward_in, backward_out = seed_sizes()
    fwd = r.module(ModuleKind.forward)
    bwd = r.module(ModuleKind.backward)
    assert fwd is not None and bwd is not None
    assert sorted(fwd.invar_sizes) == sorted(forward_in)
    sizes = dict(zip(fwd.invar_names, fwd.invar_sizes, strict=True))
    assert sizes["layer0/w1"] == sizes["layer1/w2"] == 67108864  # replicated f32[2048,8192]
    assert sizes["x"] == sizes["y"] == 524288  # f32[128,2048] split 2 ways on the batch
    assert all(n.startswith("grad:") for n in bwd.outvar_names)
    assert sorted(bwd.outvar_sizes) == sorted(backward_out)
    # SGD keeps no state: initial_var_size is the parameters, Alpa's "0.250 GB"
    assert round(r.initial_var_size / 2**30, 3) == SEED_INITIAL_GB
