"""Stage fingerprints: equal fingerprint, same measurement (docs/design.md, "The model on the
wire")."""

import hashlib
import json
from typing import Any

from schemas import ModelSpec, PlanOptions, ShardingConfig, SubmeshShape, VarSpec
from workers.measure.layer_keys import layer_key
from workers.measure.scan_runs import find_runs, scan_stages_enabled

__all__ = ["layer_key", "stage_fingerprint", "stage_fingerprint_doc", "stage_io"]

# How a stage is measured: 2 = layer pairs (no recomputation), stash of residuals, CPU peak
# with temporaries, adaptive timing. Results of another method are never reused for these.
MEASUREMENT_METHOD = 2

# The canonical document's key for a measurement that also split the backward into B and W
# (`PlanOptions.measures_split_backward`). It is present only then, so a measurement without
# the split keeps the fingerprint it always had (stored ones stay reusable), and the split
# one, a superset, is its *split twin*: a job that does not need the split may reuse it
# (`stage_fingerprint(..., split_backward=True)` names it), never the other way round.
SPLIT_BACKWARD_KEY = "split_backward"

# The canonical document's key for a stage measured with its runs of identical layers as
# `lax.scan`s (`STAGEPROF_SCAN_STAGES`, `workers.measure.compose_scan`): present only then, so a
# scanned measurement is never taken for an unrolled one, nor the other way round.
SCAN_RUNS_KEY = "scan_runs"

# PlanOptions fields that change a measurement (the rest only steer planning or limits).
MEASUREMENT_OPTIONS: tuple[str, ...] = (
    "optimizer",
    "repeats",
    "warmup",
    "max_repeats",
    "target_spread",
)


def stage_io(spec: ModelSpec, start: int, end: int) -> tuple[list[VarSpec], list[VarSpec]]:
    """The stage's inputs (read from outside start..end, in order of first use) and outputs
    (produced in start..end and used after `end`, or the loss of the last layer)."""
    produced: dict[str, VarSpec] = {}
    inputs: dict[str, VarSpec] = {}
    for layer in spec.layers[start : end + 1]:
        for v in layer.inputs:
            if v.name not in produced and v.name not in inputs:
                inputs[v.name] = v
        for v in layer.outputs:
            produced[v.name] = v
    used_after = {v.name for layer in spec.layers[end + 1 :] for v in layer.inputs}
    if end == spec.num_layers - 1:
        used_after.add(spec.loss)
    outputs = [v for name, v in produced.items() if name in used_after]
    return list(inputs.values()), outputs


def _shape(v: VarSpec) -> list[Any]:
    return [list(v.shape), v.dtype]


def config_doc(config: ShardingConfig) -> dict[str, Any]:
    """What a stage fingerprint says of its config. Today's strategies keep the document they
    always had (so stored measurements stay found); a mesh-axes config adds its axis sizes
    and rule table."""
    doc: dict[str, Any] = {
        "logical_mesh": list(config.logical_mesh),
        "strategy": config.strategy,
        "options": config.options,
    }
    if config.mesh_axes is not None:
        doc["mesh_axes"] = dict(config.mesh_axes)
        doc["rules"] = {k: list(v) for k, v in (config.rules or {}).items()}
    return doc


def stage_fingerprint_doc(
    spec: ModelSpec,
    start: int,
    end: int,
    submesh: SubmeshShape,
    config: ShardingConfig,
    device_kind: str,
    jax_version: str,
    options: PlanOptions,
    split_backward: bool | None = None,
) -> dict[str, Any]:
    """The canonical document hashed by `stage_fingerprint` (var names replaced by their
    order of first appearance in the stage, so identical blocks anywhere hash the same).
    `split_backward` (default: `options.measures_split_backward`) adds `SPLIT_BACKWARD_KEY`; a
    stage measured with runs scanned (`STAGEPROF_SCAN_STAGES`) adds `SCAN_RUNS_KEY`."""
    canon: dict[str, str] = {}

    def name(n: str) -> str:
        return canon.setdefault(n, f"v{len(canon)}")

    layers = []
    for layer in spec.layers[start : end + 1]:
        layers.append(
            {
                "fingerprint": layer_key(layer),
                "inputs": [name(v.name) for v in layer.inputs],
                "outputs": [name(v.name) for v in layer.outputs],
                "params": [_shape(p) + [p.logical_axes] for p in layer.params],
            }
        )
    inputs, outputs = stage_io(spec, start, end)
    split = options.measures_split_backward if split_backward is None else split_backward
    return {
        **({SPLIT_BACKWARD_KEY: True} if split else {}),
        **_scan_runs(spec, start, end, config, split),
        "layers": layers,
        "inputs": [[name(v.name)] + _shape(v) for v in inputs],
        "outputs": [[name(v.name)] + _shape(v) for v in outputs],
        "submesh": list(submesh.as_tuple()),
        "config": config_doc(config),
        "device_kind": device_kind,
        "jax_version": jax_version,
        "profile": {k: getattr(options, k) for k in MEASUREMENT_OPTIONS},
        "method": MEASUREMENT_METHOD,
    }


def _scan_runs(
    spec: ModelSpec, start: int, end: int, config: ShardingConfig, split: bool
) -> dict[str, Any]:
    """`{SCAN_RUNS_KEY: [[offset in the stage, length], ...]}` when the stage is measured with
    runs of identical layers scanned (`workers.measure.scan_runs`), else nothing: a stage
    measured unrolled keeps the fingerprint it always had."""
    if not scan_stages_enabled(split):
        return {}
    runs = find_runs(spec, start, end, config)
    return {SCAN_RUNS_KEY: [[r.first - start, r.length] for r in runs]} if runs else {}


def stage_fingerprint(
    spec: ModelSpec,
    start: int,
    end: int,
    submesh: SubmeshShape,
    config: ShardingConfig,
    device_kind: str,
    jax_version: str,
    options: PlanOptions,
    split_backward: bool | None = None,
) -> str:
    """sha256 (hex) of the stage's canonical JSON: layer fingerprints and wiring, stage
    input/output shapes, submesh, config, device kind, jax version, measurement options,
    whether the backward is split (`split_backward`, default from `options`) and which runs of
    identical layers are measured as scans."""
    doc = stage_fingerprint_doc(
        spec, start, end, submesh, config, device_kind, jax_version, options, split_backward
    )
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()
