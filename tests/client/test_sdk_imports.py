"""The SDK is the SDK: importing it, tracing a model and talking HTTP pulls in none of the
command line, the workers, the store or the server (nor Ray, SQLAlchemy or FastAPI)."""

import subprocess
import sys
from pathlib import Path

FORBIDDEN = ("cli", "workers", "store", "server", "migrations", "planner", "ray", "sqlalchemy")
FORBIDDEN += ("fastapi", "uvicorn", "alembic")

_CODE = f"""
import sys
import jax.numpy as jnp
import client
from client import zoo
from client.sdk import StageprofClient
client.trace(lambda p, b: jnp.mean(b["x"] @ p), jnp.ones((4, 2)), {{"x": jnp.ones((3, 4))}})
zoo.build("gpt", num_layers=1, hidden_size=16, num_heads=2, seq_len=8, vocab_size=32)
StageprofClient("http://127.0.0.1:9").close()
bad = sorted(m for m in sys.modules if m.split(".")[0] in {FORBIDDEN!r})
print(bad)
sys.exit(1 if bad else 0)
"""


def test_client_imports_neither_cli_workers_store_nor_server() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CODE],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[2],
    )
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
