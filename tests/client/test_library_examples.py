"""examples/{transformers_gpt2,equinox_gpt,haiku_lm,penzai_llama}.py run (tiny sizes) and
print what a user of each library expects: the embedding, one layer per block (one
fingerprint), the head; the spec they write loads as a `ModelSpec`."""

import importlib.util
from pathlib import Path

import pytest

from schemas import ModelSpec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    "script, extra",
    [
        ("transformers_gpt2.py", ["--model", "gpt2"]),
        ("transformers_gpt2.py", ["--model", "bert"]),
        ("equinox_gpt.py", []),
        ("haiku_lm.py", []),
        ("penzai_llama.py", []),
        ("penzai_llama.py", ["--no-layer-stack"]),
    ],
)
def test_a_library_example_traces_embed_blocks_head(
    script: str, extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = importlib.util.spec_from_file_location(f"example_{script[:-3]}", EXAMPLES / script)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    out = tmp_path / "spec.json"
    assert module.main(["--blocks", "3", "--hidden", "32", "--out", str(out), *extra]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line[:1].isdigit()]
    spec = ModelSpec.model_validate_json(out.read_text())
    assert [line.split()[1] for line in lines] == [layer.name for layer in spec.layers]
    fingerprints = [line.split()[-1] for line in lines]
    assert len(fingerprints) == 5, lines  # the embedding, 3 blocks, the head
    # penzai without a layer stack: the first block transposes the embedding's layout first
    alike = fingerprints[2:4] if "--no-layer-stack" in extra else fingerprints[1:4]
    assert len(set(alike)) == 1 and fingerprints[0] != fingerprints[1], lines
    assert fingerprints[4] != fingerprints[1], lines
