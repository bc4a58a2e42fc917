"""Rules a request must meet beyond its schema, as 422 field errors.

Every check runs before anything is written, so a refused request changes nothing.
"""

import math
from typing import Any

from pydantic import BaseModel

import programs
from schemas import ClusterSpec, ModelSpec, PlanOptions, ZooRef
from schemas.candidate_count import CandidateCount, submesh_shapes
from schemas.limits import MAX_CANDIDATES_ENV
from server.errors import Loc, field_error, invalid
from server.zoo_catalog import zoo_errors
from server.zoo_limits import size_errors

Errors = list[dict[str, Any]]


def storable_errors(value: Any, loc: Loc) -> Errors:
    """Non-finite numbers and NUL characters anywhere in `value` (neither can be stored)."""
    errors: Errors = []
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, tuple(loc))]
    while stack and len(errors) < 20:
        v, path = stack.pop()
        if isinstance(v, BaseModel):
            v = v.model_dump()
        if isinstance(v, float) and not math.isfinite(v):
            errors.append(field_error(path, f"must be a finite number, got {v}"))
        elif isinstance(v, str) and "\x00" in v:
            errors.append(field_error(path, "must not contain NUL characters"))
        elif isinstance(v, dict):
            for k, item in v.items():
                if isinstance(k, str) and "\x00" in k:
                    errors.append(field_error(path, "keys must not contain NUL characters"))
                stack.append((item, (*path, k)))
        elif isinstance(v, list | tuple):
            stack.extend((item, (*path, i)) for i, item in enumerate(v))
    return errors


def program_errors(spec: ModelSpec, loc: Loc) -> Errors:
    """Each layer's forward and backward must deserialize (`jax.export`, CPU, no devices)
    and match the vars the layer declares; a fingerprint the spec states must be the one
    its programs give (`programs.layer_fingerprint`)."""
    problems = programs.check_programs(spec) or programs.fingerprint_problems(spec)
    return [field_error((*loc, "layers", p.layer, p.field), p.message) for p in problems]


def micro_batch_errors(
    options: PlanOptions, micro_batch_size: int, loc: Loc, symbolic: bool | None = None
) -> Errors:
    """The global batch must agree with the model's micro-batch; `microbatch_search` needs
    the estimate search, counts that divide the global batch and, for sizes other than the
    model's own, a model with a symbolic batch dimension (`symbolic`; None: a zoo model,
    which the runner traces with one)."""
    if options.microbatch_search is None:
        try:
            options.check_micro_batch(micro_batch_size)
        except ValueError as e:
            return [field_error((*loc, "global_batch_size"), str(e))]
        return []
    field = (*loc, "microbatch_search")
    if options.search_mode != "estimate":
        return [
            field_error(
                field,
                "counts of micro-batches are searched by the estimate search: leave search "
                f"at 'estimate' (the default), not {options.search_mode!r}",
            )
        ]
    try:
        counts = options.microbatch_counts(micro_batch_size)
    except ValueError as e:
        return [field_error(field, str(e))]
    batch = options.global_batch(micro_batch_size)
    other = [b for b in counts if batch // b != micro_batch_size]
    if symbolic is False and other:
        sizes = sorted({batch // b for b in other})
        return [
            field_error(
                field,
                f"the model was traced at micro-batch {micro_batch_size} without a symbolic "
                f"batch dimension, so it cannot be planned at micro-batch {sizes} (counts "
                f"{other} of global batch {batch}); trace it with "
                "client.trace_symbolic_batch, or search its own size only",
            )
        ]
    return []


def submesh_errors(options: PlanOptions, cluster: ClusterSpec, loc: Loc) -> Errors:
    """Manual submeshes must divide the cluster: one host with a number of devices that
    divides `devices_per_host`, or whole hosts, a number that divides `num_hosts`; each
    listed once."""
    errors: Errors = []
    hosts_n, per_host = cluster.num_hosts, cluster.devices_per_host
    seen: set[tuple[int, int]] = set()
    for i, (hosts, devices) in enumerate(options.manual_submeshes or []):
        shape = f"({hosts}, {devices})"
        cluster_text = f"a cluster of {hosts_n} host(s) x {per_host} device(s)"
        if hosts > hosts_n or devices > per_host:
            reason = f"{shape} does not fit {cluster_text}"
        elif hosts == 1 and per_host % devices:
            reason = f"{shape}: {devices} device(s) do not divide the {per_host} of a host"
        elif hosts > 1 and devices != per_host:
            reason = f"{shape}: a multi-host submesh must use whole hosts ({per_host} devices)"
        elif hosts_n % hosts:
            reason = f"{shape}: {hosts} hosts do not divide the {hosts_n} of {cluster_text}"
        elif (hosts, devices) in seen:
            reason = f"{shape} is listed twice"
        else:
            seen.add((hosts, devices))
            continue
        errors.append(field_error((*loc, "manual_submeshes", i), reason))
    return errors


def sharding_errors(options: PlanOptions, cluster: ClusterSpec, loc: Loc) -> Errors:
    """Each of the user's `shardings` must resolve on some submesh of the job: its mesh axes'
    product (with a -1 filled) is the device count of one of the submeshes."""
    shapes = submesh_shapes(
        cluster.num_hosts, cluster.devices_per_host, options.submesh_space, options.manual_submeshes
    )
    counts = sorted({h * d for h, d in shapes})
    errors: Errors = []
    for i, strategy in enumerate(options.shardings):
        if not any(strategy.fits(n) for n in counts):
            product = math.prod(s for s in strategy.mesh_axes.values() if s != -1)
            errors.append(
                field_error(
                    (*loc, "shardings", i, "mesh_axes"),
                    f"the mesh axes' product {product} is not the device count of any submesh "
                    f"of the job ({counts}); with one axis -1 it must divide one",
                )
            )
    return errors


def measure_stage_errors(options: PlanOptions, num_layers: int, loc: Loc) -> Errors:
    """Each of `measure_stages` must lie within the model's layers (start <= end is the
    key's own rule)."""
    return [
        field_error(
            (*loc, "measure_stages", i, "end"),
            f"layer {key.end} is past the model's last layer ({num_layers - 1}): the model "
            f"has {num_layers} layers",
        )
        for i, key in enumerate(options.measure_stages)
        if key.end >= num_layers
    ][:20]


def candidate_errors(
    count: CandidateCount,
    cap: int,
    num_layers: int,
    cluster: ClusterSpec,
    options: PlanOptions,
    loc: Loc,
) -> Errors:
    """A job needs at least one stage candidate, at most `cap`, and manual submeshes that
    can cover the cluster in at most `num_layers` stages."""
    if count.total > cap:
        bound = "" if count.exact else "up to "
        return [
            field_error(
                loc,
                f"{bound}{count.total} stage candidates ({num_layers} layers on "
                f"{cluster.num_hosts}x{cluster.devices_per_host} devices), over the cap of "
                f"{cap} ({MAX_CANDIDATES_ENV}): use fewer layers, a smaller cluster, or "
                "narrow options.submesh_space, config_space, strategies or "
                "layer_imbalance_tolerance",
            )
        ]
    if count.total == 0:
        return [
            field_error(
                (*loc[:1], "options"),
                "these options leave no stage candidate (no sharding config fits any "
                "submesh: check strategies and config_space against the micro-batch size)",
            )
        ]
    if options.submesh_space == "manual":
        shapes = options.manual_submeshes or []
        usable = [h * d for (h, d), n in zip(shapes, count.per_submesh, strict=True) if n > 0]
        if cluster.num_devices not in usable and cluster.num_devices > max(usable) * num_layers:
            return [
                field_error(
                    (*loc[:1], "options", "manual_submeshes"),
                    f"cannot cover the cluster's {cluster.num_devices} devices with "
                    f"{num_layers} stage(s) of at most {max(usable)} devices",
                )
            ]
    return []


def zoo_size_errors(zoo: ZooRef, loc: Loc) -> Errors:
    """Sizes over their limit and model rules the runner would fail on (after zoo_ref_errors)."""
    problems = size_errors(zoo.name, zoo.config)
    return [field_error((*loc, *path), reason) for path, reason in problems]


def zoo_ref_errors(zoo: ZooRef, loc: Loc) -> Errors:
    return [field_error((*loc, *path), reason) for path, reason in zoo_errors(zoo.name, zoo.config)]


def raise_if(errors: Errors) -> None:
    """Raise a 422 listing `errors`, if any."""
    if errors:
        raise invalid(errors)
