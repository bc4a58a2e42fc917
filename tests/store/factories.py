"""Hand-made schemas for store tests (no jax needed)."""

import base64

from schemas import (
    LayerSpec,
    ModelSpec,
    ParamSpec,
    ProfileStatus,
    ShardingConfig,
    StageKey,
    StageProfileResult,
    SubmeshShape,
    VarSpec,
)
from tests.support.profiles import fake_profile


def tiny_spec(width: int = 8, name: str = "tiny", program_tag: str = "a") -> ModelSpec:
    """Two layers: h = x @ w1; loss = sum(h @ w2). Programs are opaque bytes here."""
    x = VarSpec(name="x", shape=(4, width), dtype="float32")
    h = VarSpec(name="h", shape=(4, width), dtype="float32")
    loss = VarSpec(name="loss", shape=(), dtype="float32")
    prog = base64.b64encode(f"program-{program_tag}".encode()).decode()
    return ModelSpec(
        name=name,
        inputs=[x],
        layers=[
            LayerSpec(
                name="layer0",
                inputs=[x],
                outputs=[h],
                params=[ParamSpec(name="w1", shape=(width, width), dtype="float32")],
                forward=prog,
                backward=prog,
                saved=["x"],
                jaxpr="{ lambda ; a b. let c = dot_general a b in (c,) }",
                flops=2.0 * 4 * width * width,
                fingerprint=f"fp-dense-{width}",
            ),
            LayerSpec(
                name="layer1",
                inputs=[h],
                outputs=[loss],
                params=[ParamSpec(name="w2", shape=(width, width), dtype="float32")],
                forward=prog,
                backward=prog,
                saved=["h"],
                grad_inputs=["h"],
                jaxpr="{ lambda ; a b. let c = dot_general a b; d = reduce_sum c in (d,) }",
                flops=2.0 * 4 * width * width,
                fingerprint=f"fp-head-{width}",
            ),
        ],
        loss="loss",
    )


def profile(
    fingerprint: str,
    status: ProfileStatus = ProfileStatus.ok,
    cost: float = 0.01,
    key: StageKey | None = None,
) -> StageProfileResult:
    """A stage on a 1 x 2 submesh costing `cost` (half forward, half backward)."""
    return fake_profile(
        fingerprint,
        status,
        forward=cost / 2,
        backward=cost / 2,
        key=key,
        submesh=SubmeshShape(hosts=1, devices_per_host=2),
        config=ShardingConfig(logical_mesh=(2, 1), strategy="data"),
        temp=10,
        samples=3,
        with_vars=True,
        failed_max_n_succ_stages=5,
    )
