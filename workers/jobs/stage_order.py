"""The order a job measures its stages in."""

from planner import CandidateSpace
from schemas import StageKey
from workers.cluster import GroupShape, Layout


def by_group_shape(
    fingerprints: list[str],
    keys_by_fp: dict[str, list[StageKey]],
    space: CandidateSpace,
    layout: Layout,
) -> list[str]:
    """The stages grouped by the shape of group that measures them (the pool runs one shape
    at a time), shapes in the order they first come, each keeping its stages' order."""
    by_shape: dict[GroupShape, list[str]] = {}
    for fp in fingerprints:
        submesh = space.submeshes[keys_by_fp[fp][0].submesh_id]
        by_shape.setdefault(layout.shape_for(submesh), []).append(fp)
    return [fp for group in by_shape.values() for fp in group]


def measure_order(keys: list[StageKey], space: CandidateSpace) -> tuple[int, int]:
    """Fewest layers first, then most devices."""
    key = keys[0]
    return (key.end - key.start, -space.submeshes[key.submesh_id].num_devices)
