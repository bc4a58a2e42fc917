"""The layers the tracer finds in other libraries' own models (tests/support/library_models.py:
transformers, equinox, dm-haiku, penzai, plain JAX, Flax NNX; tiny configs, no markers): per
model, the layers, how many share the block fingerprint, the stage candidates on a 1x2
cluster (default plan options) and the seconds of `client.trace`; and the layers when the
loss was jitted before it was traced (JAX's trace cache must not change them). Each model is
traced in a fresh process of its own, once each way. Run it on two checkouts to compare them
side by side.

    python bench/library_layers.py                     # every model
    python bench/library_layers.py --models equinox_gpt hf_gpt2

Prints a table and, as its last line, one JSON object.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import jax
from common import console, emit_json, setup_logging
from rich.table import Table

import client
from planner.candidates import enumerate_candidates
from schemas import ClusterSpec, ModelSpec, PlanOptions
from tests.support.library_models import LIBRARY_MODELS

CLUSTER = ClusterSpec(num_hosts=1, devices_per_host=2)


def _layers(spec: ModelSpec, blocks: int) -> dict[str, Any]:
    fingerprints = Counter(layer.fingerprint for layer in spec.layers)
    shared = fingerprints.most_common(1)[0][1]
    return {
        "layers": spec.num_layers,
        "fingerprints": len(fingerprints),
        "most_shared": shared,
        "embed_blocks_head": spec.num_layers == blocks + 2 and shared == blocks,
        "candidates": len(enumerate_candidates(spec, CLUSTER, PlanOptions()).keys),
        "names": [layer.name for layer in spec.layers],
    }


def measure(name: str, jit_first: bool) -> dict[str, Any]:
    """One model traced (in this process, which has traced nothing before); with `jit_first`
    its loss is jitted and run first."""
    entry = LIBRARY_MODELS[name]
    built = entry.build()
    if jit_first:
        jax.jit(built.loss_fn)(built.params, built.batch)
    start = time.perf_counter()
    try:
        spec = client.trace(built.loss_fn, built.params, built.batch, remat_variants=())
    except Exception as err:  # a model the tracer refuses: its message, shortened
        return {"error": f"{type(err).__name__}: {str(err)[:160]}"}
    return _layers(spec, entry.blocks) | {"trace_s": time.perf_counter() - start}


def _in_child(name: str, jit_first: bool) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", name] + (["--jit-first"] * jit_first)
    env = dict(os.environ, HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu")
    proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1][:160]}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(LIBRARY_MODELS))
    parser.add_argument("--child", choices=list(LIBRARY_MODELS), help=argparse.SUPPRESS)
    parser.add_argument("--jit-first", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    setup_logging(args.verbose)
    if args.child:
        print(json.dumps(measure(args.child, args.jit_first)))
        return
    rows = [
        {
            "model": name,
            "blocks": LIBRARY_MODELS[name].blocks,
            "fresh": _in_child(name, False),
            "after_jit": _in_child(name, True),
        }
        for name in args.models or LIBRARY_MODELS
    ]
    table = Table(title="layers of the libraries' own models (no markers)")
    for col in ("model", "blocks", "layers", "fingerprints", "candidates", "trace s", "after jit"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for row in rows:
        fresh, jitted = row["fresh"], row["after_jit"]
        if "error" in fresh:
            table.add_row(row["model"], str(row["blocks"]), fresh["error"], "", "", "", "")
            continue
        same = "error" not in jitted and jitted["names"] == fresh["names"]
        table.add_row(
            row["model"],
            str(row["blocks"]),
            str(fresh["layers"]),
            f"{fresh['fingerprints']} ({fresh['most_shared']} shared)",
            str(fresh["candidates"]),
            f"{fresh['trace_s']:.2f}",
            "same" if same else f"{jitted.get('layers', jitted.get('error'))}",
        )
    console().print(table)
    emit_json({"cluster": "1x2", "models": rows})


if __name__ == "__main__":
    main()
