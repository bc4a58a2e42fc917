"""Other libraries' models, traced with no markers, planned end to end by `stageprof plan
--model` on two virtual CPU devices (issue 36): the plan's stages, with the layers it runs
outside the pipeline, cover the embedding, the blocks and the head, and cut only between
them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.client.test_libraries import assert_embed_blocks_head, traced
from tests.support.library_models import LIBRARY_MODELS
from tests.support.plan_layers import assert_every_layer_planned

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--config-space", "data_parallel_only", "--strategies", "data", "--repeats", "2"]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["equinox_gpt", "penzai_stack"])
def test_a_library_model_plans_end_to_end(name: str, tmp_path: Path) -> None:
    _, spec = traced(name)
    assert_embed_blocks_head(spec, LIBRARY_MODELS[name].blocks)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(spec.model_dump_json())
    env = dict(os.environ, STAGEPROF_DATABASE_URL=f"sqlite:///{tmp_path / 'plan.db'}")
    env.pop("RAY_ADDRESS", None)
    planned = subprocess.run(
        [sys.executable, "-m", "cli", "plan", "--model", str(spec_path), *FAST]
        + ["--hosts", "1", "--devices-per-host", "2", "--micro-batches", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=800,
        env=env,
        cwd=ROOT,
    )
    assert planned.returncode == 0, planned.stderr[-3000:]
    plan = json.loads(planned.stdout.strip().splitlines()[-1])["plan"]
    assert_every_layer_planned(plan, [layer.name for layer in spec.layers])
