"""What every plan printed by `stageprof plan --json` must do with the model's layers."""

from collections.abc import Sequence
from typing import Any


def assert_every_layer_planned(plan: dict[str, Any], layer_names: Sequence[str]) -> None:
    """The pipeline's stages are contiguous and cut only between layers; the layers around
    it (embedding, head) are either in it or run outside it (`outside_layers`, on by
    default, where that is faster: a timing decision), each exactly once."""
    stages, outside = plan["stages"], plan["outside"]
    assert stages, plan
    assert all(a["end"] + 1 == b["start"] for a, b in zip(stages, stages[1:], strict=False))
    first, last = stages[0]["start"], stages[-1]["end"]
    around = [i for i in range(len(layer_names)) if not first <= i <= last]
    assert sorted(i for st in outside for i in range(st["start"], st["end"] + 1)) == around
    pipelined = [n for stage in stages for n in stage["layer_names"]]
    assert pipelined == list(layer_names[first : last + 1])
    assert sorted(n for st in outside for n in st["layer_names"]) == sorted(
        layer_names[i] for i in around
    )
