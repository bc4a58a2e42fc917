"""What the server's own fingerprints cost an upload: checking every layer's programs and
recomputing its fingerprint (`programs.check_programs` + `programs.layer_fingerprint`), in a
fresh process as a server meets it, beside the tracing that made the spec and the spec's size.

    python bench/upload_check.py --blocks 16

Prints a table and, as its last line, one JSON object.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import GPT_WIDTHS, QUICK_WIDTHS, ROOT, console, emit_json, setup_logging
from rich.table import Table

_CHECK = """
import json, sys, time
t0 = time.perf_counter()
import programs
from schemas import ModelSpec
t1 = time.perf_counter()
spec = ModelSpec.model_validate_json(open(sys.argv[1]).read())
t2 = time.perf_counter()
problems = programs.check_programs(spec)
t3 = time.perf_counter()
fps = [programs.layer_fingerprint(layer) for layer in spec.layers]
t4 = time.perf_counter()
from programs import fingerprint, load
fingerprint._program_facts.cache_clear()
load.load_program.cache_clear()
programs.check_programs(spec)
again = [programs.layer_fingerprint(layer) for layer in spec.layers]
t5 = time.perf_counter()
from jax._src import xla_bridge
print(json.dumps({"import_s": t1 - t0, "parse_s": t2 - t1, "check_s": t3 - t2,
                  "fingerprint_s": t4 - t3, "warm_check_and_fingerprint_s": t5 - t4,
                  "problems": len(problems), "stable": again == fps,
                  "equal": fps == [layer.fingerprint for layer in spec.layers],
                  "backends": sorted(xla_bridge._backends)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="tiny widths (smoke test)")
    args = parser.parse_args()
    setup_logging()
    from client import zoo

    widths = QUICK_WIDTHS if args.quick else GPT_WIDTHS
    started = time.perf_counter()
    spec = zoo.build("gpt", num_layers=args.blocks, **widths)
    trace_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.json"
        path.write_text(spec.model_dump_json())
        size = path.stat().st_size
        out = subprocess.run(
            [sys.executable, "-c", _CHECK, str(path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    server = json.loads(out.stdout.strip().splitlines()[-1])
    unique = len({(layer.forward, layer.backward) for layer in spec.layers})
    table = Table(title=f"server-side program check, GPT with {args.blocks} blocks")
    table.add_column("step")
    table.add_column("seconds", justify="right")
    rows = [
        ("client: trace + export (reference)", trace_s),
        ("server: import jax.export (once per process)", server["import_s"]),
        ("server: parse the spec JSON", server["parse_s"]),
        ("server: deserialize + check signatures", server["check_s"]),
        ("server: recompute fingerprints (first upload of a process)", server["fingerprint_s"]),
        ("server: check + fingerprints, a later upload", server["warm_check_and_fingerprint_s"]),
    ]
    for name, seconds in rows:
        table.add_row(name, f"{seconds:.3f}")
    out_console = console()
    out_console.print(table)
    out_console.print(
        f"{spec.num_layers} layers ({unique} distinct program pairs), spec {size / 2**20:.2f} MiB; "
        f"fingerprints equal to the SDK's: {server['equal']}; backends initialised by the "
        f"check: {server['backends'] or 'none'}"
    )
    emit_json(
        {
            "blocks": args.blocks,
            "layers": spec.num_layers,
            "distinct_program_pairs": unique,
            "spec_mib": size / 2**20,
            "trace_s": trace_s,
            **{
                k: server[k]
                for k in (
                    "import_s",
                    "parse_s",
                    "check_s",
                    "fingerprint_s",
                    "warm_check_and_fingerprint_s",
                )
            },
            "server_check_total_s": server["parse_s"] + server["check_s"] + server["fingerprint_s"],
            "fingerprints_equal": server["equal"] and server["stable"],
            "problems": server["problems"],
            "backends_initialised": server["backends"],
        }
    )


if __name__ == "__main__":
    main()
