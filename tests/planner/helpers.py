"""Small specs and profile results for planner tests."""

from schemas import (
    ClusterSpec,
    LayerSpec,
    ModelSpec,
    ModuleKind,
    ProfileStatus,
    ShardingConfig,
    StageProfileResult,
    SubmeshShape,
    VarSpec,
    max_n_succ_stages,
)
from schemas.profile import MAX_SUCC_STAGES
from tests.support.profiles import fake_module, fake_profile

MB = 8
HIDDEN = 16
DEVICE_MEMORY = ClusterSpec.model_fields["device_memory_bytes"].default
PEAK = 1000  # fake_profile's peak per module
# A small device (ClusterSpec's least memory is 1 MiB) for tests of binding memory: their
# figures are those of a 10 kB device, scaled by MEMORY_SCALE (every memory rule is linear).
MEMORY_SCALE = 105
SMALL_DEVICE = 10_000 * MEMORY_SCALE


def programless_chain_spec(
    num_layers: int, flops: list[float] | None = None, skip: bool = False
) -> ModelSpec:
    """x -> h0 -> h1 ... -> loss, layers without programs (what the planner reads: the graph
    and FLOPs); with `skip`, the last layer also reads h0."""
    x = VarSpec(name="x", shape=(MB, HIDDEN), dtype="float32")
    y = VarSpec(name="y", shape=(MB, HIDDEN), dtype="float32")
    layers = []
    for i in range(num_layers):
        inputs = [x if i == 0 else VarSpec(name=f"h{i - 1}", shape=(MB, HIDDEN), dtype="float32")]
        if i == num_layers - 1:
            inputs.append(y)
            if skip and num_layers > 2:
                inputs.append(VarSpec(name="h0", shape=(MB, HIDDEN), dtype="float32"))
            outputs = [VarSpec(name="loss", shape=(), dtype="float32")]
        else:
            outputs = [VarSpec(name=f"h{i}", shape=(MB, HIDDEN), dtype="float32")]
        layers.append(
            LayerSpec(
                name=f"layer{i}",
                inputs=inputs,
                outputs=outputs,
                forward="",
                backward="",
                grad_inputs=[v.name for v in inputs if v.name not in ("x", "y")],
                flops=flops[i] if flops else 0.0,
            )
        )
    return ModelSpec(inputs=[x, y], layers=layers, loss="loss")


def result(
    submesh: SubmeshShape,
    config: ShardingConfig,
    forward: float,
    backward: float,
    max_n_succ_stages: int = 100,
    status: ProfileStatus = ProfileStatus.ok,
    num_layers: int = 1,
    spread: float = 0.0,
) -> StageProfileResult:
    """A measured (or failed) stage candidate; `spread`: each module's relative spread.
    Its memory makes Alpa's rule give `max_n_succ_stages` on a device of `DEVICE_MEMORY`
    (the cluster's default): the planner recomputes the rule for the planning job."""
    initial, intermediate = stash_for(max_n_succ_stages)
    return fake_profile(
        f"fp-{submesh}-{config.label()}-{forward}",
        status,
        forward=forward,
        backward=backward,
        error="boom",
        submesh=submesh,
        config=config,
        num_layers=num_layers,
        spread=spread,
        available_memory=DEVICE_MEMORY,
        initial_var_size=initial,
        intermediate_size=intermediate,
        max_n_succ_stages=max_n_succ_stages,
    )


def stash_for(succ: int, peak: int = PEAK, available: int = DEVICE_MEMORY) -> tuple[int, int]:
    """(initial_var_size, intermediate_size) for which Alpa's rule gives `succ` stages after
    a stage of this `peak` on a device of `available` bytes."""
    if succ < 0:
        return available, 20  # parameters alone fill the device
    if succ >= MAX_SUCC_STAGES:
        return 10, 0
    free = available - peak - 10
    intermediate = free // (succ + 1)
    assert max_n_succ_stages(available, peak, 10, intermediate) == succ
    return 10, intermediate


def cluster(
    num_hosts: int = 1, devices_per_host: int = 4, device_memory: int = DEVICE_MEMORY
) -> ClusterSpec:
    return ClusterSpec(
        num_hosts=num_hosts, devices_per_host=devices_per_host, device_memory_bytes=device_memory
    )


def split_result(
    submesh: SubmeshShape,
    config: ShardingConfig,
    forward: float,
    input_grad: float,
    weight_grad: float,
    num_layers: int = 1,
    available: int = 2**30,
    peak: int = 1000,
    initial: int = 10,
    intermediate: int = 20,
    weight_stash: int = 5,
    split: bool = True,
) -> StageProfileResult:
    """A measured stage whose backward was also measured split into B and W (`split`), its
    memory given: Alpa's `max_n_succ_stages` follows from it."""
    kinds = [(ModuleKind.forward, forward), (ModuleKind.backward, input_grad + weight_grad)]
    if split:
        kinds += [
            (ModuleKind.backward_input, input_grad),
            (ModuleKind.backward_weight, weight_grad),
        ]
    return StageProfileResult(
        status=ProfileStatus.ok,
        fingerprint=f"fp-{submesh}-{config.label()}-{forward}-{input_grad}-{weight_grad}",
        submesh=submesh,
        config=config,
        num_layers=num_layers,
        module_profile_results=tuple(fake_module(k, t, peak=peak) for k, t in kinds),
        available_memory=available,
        initial_var_size=initial,
        intermediate_size=intermediate,
        weight_stash_size=weight_stash if split else 0,
        max_n_succ_stages=max_n_succ_stages(available, peak, initial, intermediate),
    )
