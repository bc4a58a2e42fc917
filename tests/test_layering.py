"""The import contracts in pyproject.toml (`lint-imports`) hold on this tree and fail on a
deliberately wrong import: each case copies the packages into a temp dir, adds one bad module
and runs lint-imports with the project's own configuration there."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("schemas", "programs", "store", "planner", "workers", "server", "client", "cli")
PACKAGES += ("migrations",)
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project's packages (Python files only) and its pyproject.toml."""
    root = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, root / package, ignore=ignore_non_python)
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def ignore_non_python(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if not n.endswith(".py") and not (Path(folder) / n).is_dir()]


def test_the_contracts_hold_on_this_tree(tree: Path) -> None:
    result = lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


BAD_IMPORTS = [
    # ({module to add: its source}, the contract it breaks)
    ({"schemas/bad.py": "import store.engine\n"}, "schemas imports none of our packages"),
    ({"planner/bad.py": "import jax\n"}, "planner imports only schemas"),
    ({"server/bad.py": "import workers\n"}, "server imports only schemas"),
    ({"client/bad.py": "from store import engine\n"}, "client imports only schemas and programs"),
    ({"workers/measure/bad.py": "import workers.jobs.runner\n"}, "workers' rooms"),
    ({"workers/measure/bad.py": "import ray\n"}, "workers.measure (one process"),
    ({"workers/cluster/bad.py": "import store.engine\n"}, "workers.cluster (Ray groups"),
    (
        {"planner/bad.py": "from planner import bad2\n", "planner/bad2.py": "import planner.bad\n"},
        "no import cycles",
    ),
]


@pytest.mark.parametrize(("modules", "contract"), BAD_IMPORTS)
def test_a_wrong_import_breaks_its_contract(
    tree: Path, modules: dict[str, str], contract: str
) -> None:
    for path, source in modules.items():
        (tree / path).write_text(source)
    try:
        result = lint_imports(tree)
    finally:
        for path in modules:
            (tree / path).unlink()
    assert result.returncode != 0
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken.replace("\n", " "), result.stdout
