"""The server's zoo catalog agrees with `client.zoo` (the server may not import it)."""

import subprocess
import sys

import pytest

from server.zoo_catalog import ZOO, zoo_errors

zoo = pytest.importorskip("client.zoo")  # imports jax; the server never does


def test_names_match() -> None:
    assert sorted(ZOO) == zoo.names()


@pytest.mark.parametrize("name", sorted(ZOO))
def test_override_keys_types_and_presets_match(name: str) -> None:
    model = zoo.get(name)
    kinds = {key: type(value).__name__ for key, value in model.defaults.items()}
    assert ZOO[name].overrides == kinds
    assert sorted(ZOO[name].presets) == sorted(model.presets)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_what_the_catalog_accepts_the_zoo_accepts(name: str) -> None:
    entry = ZOO[name]
    config = {key: 2 for key, kind in entry.overrides.items() if kind == "int"}
    assert zoo_errors(name, config) == []
    zoo.get(name).config(config)  # raises on a key or type the zoo does not take
    if entry.presets:
        preset = {"preset": entry.presets[0]}
        assert zoo_errors(name, preset) == []
        zoo.get(name).config(preset)


@pytest.mark.parametrize(
    "config", [{"bogus": 1}, {"num_layers": "2"}, {"num_layers": 0}, {"preset": "nope"}]
)
def test_what_the_catalog_refuses_the_zoo_refuses(config: dict) -> None:
    assert zoo_errors("gpt", config)
    with pytest.raises(ValueError):
        zoo.get("gpt").config(config)


def test_server_imports_neither_ray_nor_the_workers_and_touches_no_device() -> None:
    # jax.export is allowed (programs are checked on upload), a jax backend is not.
    code = (
        "import sys; from server import create_app, Settings; "
        "create_app(Settings(database_url='sqlite://')); "
        "import server.routes.pages, server.zoo_catalog, store.queries; "
        "from jax._src import xla_bridge; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', "
        "'client', 'cli', 'workers', 'planner')) + sorted(xla_bridge._backends); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
