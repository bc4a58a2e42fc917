"""Rules a request must meet beyond its schema, as 422 field errors.

Every check runs before anything is written, so a refused request changes nothing.
"""

import math
from typing import Any

import jax
from pydantic import BaseModel

import programs

from schemas import ClusterSpec, ModelSpec, PlanOptions, ZooRef
from server.errors import Loc, field_error, invalid
from server.zoo_catalog import zoo_errors

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
    errors = [
        field_error((*loc, "layers", p.layer, p.field), p.message)
        for p in programs.check_programs(spec)
    ]
    if errors:
        return errors
    for i, layer in enumerate(spec.layers):
        try:
            computed = programs.layer_fingerprint(layer)
        except Exception as e:  # noqa: BLE001 - a module jax cannot read is a bad spec
            where = (*loc, "layers", i, "forward")
            errors.append(field_error(where, f"its StableHLO module cannot be read: {e}"))
            continue
        if layer.fingerprint and layer.fingerprint != computed:
            errors.append(
                field_error(
                    (*loc, "layers", i, "fingerprint"),
                    f"is {layer.fingerprint!r} but the layer's programs give {computed!r}: "
                    "the service computes fingerprints from the programs (leave it empty, "
                    f"or trace with the server's jax {jax.__version__})",
                )
            )
    return errors


def micro_batch_errors(options: PlanOptions, micro_batch_size: int, loc: Loc) -> Errors:
    try:
        options.check_micro_batch(micro_batch_size)
    except ValueError as e:
        return [field_error((*loc, "global_batch_size"), str(e))]
    return []


def submesh_errors(options: PlanOptions, cluster: ClusterSpec, loc: Loc) -> Errors:
    """Manual submeshes must fit in the cluster."""
    errors: Errors = []
    for i, (hosts, devices) in enumerate(options.manual_submeshes or []):
        if not (1 <= hosts <= cluster.num_hosts and 1 <= devices <= cluster.devices_per_host):
            errors.append(
                field_error(
                    (*loc, "manual_submeshes", i),
                    f"({hosts}, {devices}) does not fit a cluster of {cluster.num_hosts} "
                    f"host(s) x {cluster.devices_per_host} device(s)",
                )
            )
    return errors


def zoo_ref_errors(zoo: ZooRef, loc: Loc) -> Errors:
    return [field_error((*loc, *path), reason) for path, reason in zoo_errors(zoo.name, zoo.config)]


def raise_if(errors: Errors) -> None:
    """Raise a 422 listing `errors`, if any."""
    if errors:
        raise invalid(errors)
