"""What every library example does once its loss is traced: print the layers, check that the
exported programs load, write the spec for `stageprof plan --model`."""

import json
from pathlib import Path

from schemas import ModelSpec
from workers.measure.compose import check_programs


def show_and_write(spec: ModelSpec, out: Path | None) -> None:
    """Print one line per layer (name, MFLOP, parameters, fingerprint): identical blocks share
    a fingerprint and are measured once. Check every program deserializes for this platform;
    write the spec JSON to `out`."""
    for i, layer in enumerate(spec.layers):
        size = layer.param_bytes / 1e3
        print(
            f"{i}: {layer.name:28s} {layer.flops / 1e6:8.2f} MFLOP {size:9.1f} kB params  "
            f"{layer.fingerprint[:12]}"
        )
    problems = check_programs(spec)
    assert not problems, problems
    if out is not None:
        out.write_text(json.dumps(spec.model_dump(mode="json")))
        print(f"wrote {out}; plan it with: stageprof plan --model {out} --devices-per-host 2")
