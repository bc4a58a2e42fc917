"""Hand-made schemas for store tests (no jax needed)."""

import base64

from schemas import (
    LayerSpec,
    ModelSpec,
    ModuleKind,
    ModuleProfileResult,
    ParamSpec,
    ProfileStatus,
    ShardingConfig,
    StageKey,
    StageProfileResult,
    SubmeshShape,
    VarSpec,
)


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
    modules: tuple[ModuleProfileResult, ...] = ()
    if status == ProfileStatus.ok:
        modules = tuple(
            ModuleProfileResult(
                module=kind,
                compute_cost=cost / 2,
                peak_memory=1000,
                temp_buffer_size=10,
                invar_names=("w", "x"),
                outvar_names=("y",),
                invar_sizes=(400, 100),
                outvar_sizes=(100,),
                donated_invars=(False, False),
                available_memory=2**30,
                compute_cost_samples_s=(cost / 2,) * 3,
            )
            for kind in (ModuleKind.forward, ModuleKind.backward)
        )
    return StageProfileResult(
        status=status,
        error=None if status == ProfileStatus.ok else f"{status.value} happened",
        fingerprint=fingerprint,
        key=key,
        submesh=SubmeshShape(hosts=1, devices_per_host=2),
        config=ShardingConfig(logical_mesh=(2, 1), strategy="data"),
        num_layers=1,
        module_profile_results=modules,
        available_memory=2**30,
        initial_var_size=400,
        intermediate_size=100,
        max_n_succ_stages=5,
    )
