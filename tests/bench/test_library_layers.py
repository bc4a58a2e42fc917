"""bench/library_layers.py at a small setting: its JSON line carries, per model, the layers
traced fresh and after a jit, and the libraries' models come out as embed, blocks, head."""

import pytest

from tests.support.scripts import run_script


@pytest.mark.slow
def test_library_layers() -> None:
    out = run_script("library_layers.py", "--models", "hf_gpt2", "equinox_gpt", timeout=600)
    assert out["cluster"] == "1x2"
    rows = {row["model"]: row for row in out["models"]}
    assert set(rows) == {"hf_gpt2", "equinox_gpt"}
    for row in rows.values():
        fresh, jitted = row["fresh"], row["after_jit"]
        assert {"layers", "fingerprints", "candidates", "trace_s", "names"} <= set(fresh)
        assert fresh["embed_blocks_head"] and fresh["layers"] == row["blocks"] + 2, fresh
        assert jitted["names"] == fresh["names"]
    # the equinox GPT plans over as many candidates as transformers' GPT-2 of its size
    assert rows["equinox_gpt"]["fresh"]["candidates"] == rows["hf_gpt2"]["fresh"]["candidates"]
