"""Run a `bench/` script as its users do and read its JSON last line."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.xla_flags import with_fast_compile

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def run_script(name: str, *args: str, timeout: float = 600) -> dict[str, Any]:
    """Run `bench/<name>` with `args`; assert it succeeds; its last stdout line as JSON."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "XLA_FLAGS")}
    env["XLA_FLAGS"] = with_fast_compile("")  # the script sets its own device counts
    proc = subprocess.run(
        [sys.executable, str(BENCH / name), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-4000:]
    return json.loads(lines[-1])
