"""The optional communication term: activation bytes crossing stage boundaries."""

import numpy as np
from numpy.typing import NDArray

from schemas import ClusterSpec, ModelSpec, SubmeshShape


def boundary_bytes(spec: ModelSpec) -> NDArray[np.int64]:
    """`out[i]`: bytes per micro-batch of the vars produced by layers `<= i` and read by a
    layer `> i`, i.e. what a stage ending at layer `i` sends to the next (shape `[L]`).

    Model inputs are not counted: every stage reads its batch inputs itself.
    """
    num_layers = spec.num_layers
    producer: dict[str, tuple[int, int]] = {}  # var -> (producing layer, bytes)
    for i, layer in enumerate(spec.layers):
        for v in layer.outputs:
            producer[v.name] = (i, v.size_bytes)
    last_reader: dict[str, int] = {}
    for i, layer in enumerate(spec.layers):
        for v in layer.inputs:
            if v.name in producer and producer[v.name][0] < i:
                last_reader[v.name] = i
    delta = np.zeros(num_layers + 1, dtype=np.int64)
    for name, reader in last_reader.items():
        made, size = producer[name]
        delta[made] += size  # crosses boundaries made .. reader - 1
        delta[reader] -= size
    return np.cumsum(delta)[:num_layers]


def transfer_seconds(
    spec: ModelSpec, cluster: ClusterSpec, submeshes: list[SubmeshShape]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per stage range and submesh, the seconds it spends sending, shape `[L, L, S]` each.

    Forward: stage `(start, end)` sends the activations crossing the boundary after `end`;
    backward: it sends the gradients of the activations crossing the boundary before
    `start` (same bytes). Bandwidth is the intra-host one when the stage's submesh lies on
    one host, else the inter-host one. Returns (forward_seconds, backward_seconds).
    """
    crossing = boundary_bytes(spec).astype(np.float64)
    num_layers = spec.num_layers
    after = crossing.copy()
    after[-1] = 0.0  # nothing follows the last layer
    before = np.concatenate([[0.0], crossing[:-1]])
    bandwidth = np.array(
        [
            cluster.intra_host_bandwidth_bytes_per_s
            if s.hosts == 1
            else cluster.inter_host_bandwidth_bytes_per_s
            for s in submeshes
        ]
    )
    shape = (num_layers, num_layers, len(submeshes))
    forward = np.broadcast_to(after[None, :, None] / bandwidth[None, None, :], shape).copy()
    backward = np.broadcast_to(before[:, None, None] / bandwidth[None, None, :], shape).copy()
    return forward, backward
