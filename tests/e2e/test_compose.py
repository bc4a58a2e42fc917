"""docker-compose.yml (+ the GPU override) and the Dockerfile agree with the code: no Docker
engine needed. Every `stageprof ...` command parses with the CLI's parser and every `ray start`
with Ray's, every STAGEPROF_* variable is one the code reads, the services start in order and
share one database and Ray, and the workers offer their devices to Ray as the runner expects
(CPU workers the `stageprof_devices` resource, GPU workers Ray's own GPUs)."""

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.commands.worker import runner_config
from cli.main import build_parser
from server.settings import Settings
from workers.cluster.ray_env import DEVICE_RESOURCE

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "schemas",
    "programs",
    "store",
    "migrations",
    "planner",
    "workers",
    "server",
    "client",
    "cli",
)
STAGEPROF_SERVICES = ("migrate", "ray-head", "api", "worker")


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / name).read_text())


def merge(base: Any, override: Any) -> Any:
    """Compose's merge of an override file: mappings merge key by key, the rest replaces."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = merge(base[key], value) if key in base else value
        return out
    return override


BASE = load("docker-compose.yml")
GPU = merge(BASE, load("docker-compose.gpu.yml"))
COMPOSES = pytest.mark.parametrize("compose", [BASE, GPU], ids=["cpu", "gpu"])


@pytest.fixture(autouse=True)
def _no_stageprof_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """CLI defaults read STAGEPROF_* at parser build time: keep this shell's out of them."""
    for name in [n for n in os.environ if n.startswith("STAGEPROF_")]:
        monkeypatch.delenv(name)


def _words(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    words = shlex.split(value) if isinstance(value, str) else [str(v) for v in value]
    return [w.replace("$$", "$") for w in words]  # compose's escape for a literal $


def service_argv(service: dict[str, Any]) -> list[str]:
    """What the container runs: its entrypoint + command (the image has no ENTRYPOINT)."""
    return _words(service.get("entrypoint")) + _words(service.get("command"))


def shell_commands(argv: list[str]) -> list[list[str]]:
    """The commands a container runs: `sh -c SCRIPT $0 ARGS...` split on && and ;, with
    "$@" replaced by ARGS; any other argv is one command."""
    if argv[:2] != ["sh", "-c"]:
        return [argv]
    script, positional = argv[2], argv[4:]
    commands = []
    for part in re.split(r"&&|;", script):
        words = shlex.split(part)
        if words:
            at = words.index("$@") if "$@" in words else None
            commands.append(words if at is None else words[:at] + positional + words[at + 1 :])
    return commands


def stageprof_args(command: list[str]) -> list[str] | None:
    """The arguments of a `stageprof` command (after `exec` and `env VAR=...`), else None."""
    words = list(command)
    while words and words[0] == "exec":
        words.pop(0)
    if words and words[0] == "env":
        words.pop(0)
        while words and "=" in words[0]:
            words.pop(0)
    return words[1:] if words and words[0] == "stageprof" else None


def parse(args: list[str]) -> argparse.Namespace:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"`stageprof {shlex.join(args)}` does not parse: {err.getvalue()}")


def stageprof_commands(compose: dict[str, Any]) -> dict[str, list[argparse.Namespace]]:
    """Every service's `stageprof` commands, parsed."""
    found: dict[str, list[argparse.Namespace]] = {}
    for name, service in compose["services"].items():
        for command in shell_commands(service_argv(service)):
            args = stageprof_args(command)
            if args is not None:
                found.setdefault(name, []).append(parse(args))
    return found


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::([-?])([^}]*))?\}|(\w+))")


def expand(text: str, env: dict[str, str]) -> str:
    """`$VAR`, `${VAR}`, `${VAR:-default}` and `${VAR:?message}` as sh (and compose's
    interpolation) expand them; an unset `${VAR:?...}` stays as it is."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(4)
        if env.get(name):
            return env[name]
        if match.group(2) == "-":
            return match.group(3)
        return match.group(0) if match.group(2) == "?" else ""

    return _VARIABLE.sub(one, text)


def container_env(service: dict[str, Any]) -> dict[str, str]:
    """The service's environment inside its container: compose's `${VAR:-default}` values
    interpolated as on a host that sets none of them."""
    return {name: expand(value, {}) for name, value in env_of(service).items()}


def ray_start_args(compose: dict[str, Any], name: str) -> list[str]:
    """The arguments of the service's `ray start`, its shell variables expanded."""
    service = compose["services"][name]
    env = container_env(service)
    (command,) = [c for c in shell_commands(service_argv(service)) if c[:2] == ["ray", "start"]]
    args = [expand(word, env) for word in command[2:]]
    assert not [a for a in args if "$" in a], f"{name}: a variable left unexpanded in {args}"
    return args


def flag_value(args: list[str], flag: str) -> str | None:
    values = [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]
    assert len(values) <= 1, f"{flag} given twice: {args}"
    return values[0] if values else None


def test_the_stack_has_its_services() -> None:
    assert set(STAGEPROF_SERVICES) | {"postgres"} <= set(BASE["services"])


def test_postgres_keeps_its_data_in_a_volume_and_reports_health() -> None:
    pg = BASE["services"]["postgres"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in pg["volumes"]}
    assert mounts["/var/lib/postgresql/data"] in BASE["volumes"]
    test = " ".join(pg["healthcheck"]["test"])
    user, db = env_of(pg)["POSTGRES_USER"], env_of(pg)["POSTGRES_DB"]
    assert "pg_isready" in test and f"-U {user}" in test and f"-d {db}" in test


@COMPOSES
def test_every_stageprof_command_parses_with_the_cli(compose: dict[str, Any]) -> None:
    commands = stageprof_commands(compose)
    assert {name: [a.command for a in found] for name, found in commands.items()} == {
        "migrate": ["db"],
        "api": ["serve"],
        "worker": ["worker"],
    }
    assert commands["migrate"][0].db_action == "upgrade"
    assert commands["migrate"][0].revision == "head"


def test_the_api_serves_on_its_published_port_with_several_workers() -> None:
    api = BASE["services"]["api"]
    (args,) = stageprof_commands(BASE)["api"]
    assert args.host == "0.0.0.0" and args.workers >= 2
    assert args.no_migrate  # the migrate service owns the schema
    assert [int(p.split(":")[-1]) for p in api["ports"]] == [args.port]
    assert f"127.0.0.1:{args.port}/healthz" in " ".join(api["healthcheck"]["test"])


def test_every_stageprof_variable_is_one_the_code_reads() -> None:
    read = {"STAGEPROF_" + name.upper() for name in Settings.model_fields}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            read |= set(re.findall(r"STAGEPROF_[A-Z_]+", path.read_text()))
    set_here = {
        name
        for compose in (BASE, GPU)
        for service in compose["services"].values()
        for name in env_of(service)
        if name.startswith("STAGEPROF_")
    }
    assert set_here, "no STAGEPROF_* variable found: the parser above is wrong"
    assert set_here <= read, f"set in compose but read nowhere: {sorted(set_here - read)}"


def test_migrate_api_and_workers_share_the_postgres_database() -> None:
    services = BASE["services"]
    urls = {
        name: env_of(services[name])["STAGEPROF_DATABASE_URL"]
        for name in STAGEPROF_SERVICES
        if name != "ray-head"
    }
    assert len(set(urls.values())) == 1, urls
    pg = env_of(services["postgres"])
    user, password, db = pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"]
    expected = f"postgresql+psycopg://{user}:{password}@postgres:5432/{db}"
    assert set(urls.values()) == {expected}


def test_services_start_in_order() -> None:
    services = BASE["services"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("api", "worker"):
        condition = services[name]["depends_on"]["migrate"]["condition"]
        assert condition == "service_completed_successfully", name
    assert services["worker"]["depends_on"]["ray-head"]["condition"] == "service_healthy"
    assert "healthcheck" in services["ray-head"]


@COMPOSES
def test_workers_join_the_ray_head_then_run_a_runner(compose: dict[str, Any]) -> None:
    head, worker = compose["services"]["ray-head"], compose["services"]["worker"]
    head_argv = service_argv(head)
    assert head_argv[:3] == ["ray", "start", "--head"] and "--block" in head_argv
    (port,) = [a.split("=", 1)[1] for a in head_argv if a.startswith("--port=")]
    env = env_of(worker)
    assert env["RAY_ADDRESS"] == f"ray-head:{port}"
    ray_start, runner = shell_commands(service_argv(worker))
    assert ray_start[:2] == ["ray", "start"] and "--address=$RAY_ADDRESS" in ray_start
    assert stageprof_args(runner) == ["worker", *_words(worker.get("command"))]
    # The head, its nodes and the drivers share Ray's auth settings.
    ray_auth = {k: v for k, v in env.items() if k.startswith("RAY_AUTH")}
    assert ray_auth and ray_auth == {
        k: v for k, v in env_of(head).items() if k.startswith("RAY_AUTH")
    }


@COMPOSES
def test_every_ray_start_parses_with_rays_cli(compose: dict[str, Any]) -> None:
    import click
    from ray.scripts.scripts import start

    for name in ("ray-head", "worker"):
        args = ray_start_args(compose, name)
        try:
            start.make_context("ray start", list(args))
        except click.ClickException as err:
            pytest.fail(f"{name}: `ray start {shlex.join(args)}` does not parse: {err}")


def test_cpu_workers_offer_their_devices_as_the_stageprof_devices_resource() -> None:
    worker = BASE["services"]["worker"]
    resources = flag_value(ray_start_args(BASE, "worker"), "--resources")
    assert resources is not None, "CPU workers must offer their devices to Ray"
    devices = int(container_env(worker)["NODE_DEVICES"])
    assert devices >= 1 and json.loads(resources) == {DEVICE_RESOURCE: devices}
    # The head schedules only: no CPUs and no devices, so measuring runs on the workers.
    head = ray_start_args(BASE, "ray-head")
    assert flag_value(head, "--num-cpus") == "0" and flag_value(head, "--resources") is None


def test_gpu_workers_offer_the_gpus_ray_detects() -> None:
    args = ray_start_args(GPU, "worker")
    assert flag_value(args, "--resources") is None  # no virtual devices beside the GPUs
    assert flag_value(args, "--num-gpus") is None  # Ray counts the reserved GPUs itself


@COMPOSES
def test_runners_pack_measuring_groups_onto_the_cluster(compose: dict[str, Any]) -> None:
    """No --devices-per-worker (one pool of equal actors, packing off) and no --workers (the
    runner fits as many groups as the cluster's devices and CPUs allow)."""
    (args,) = stageprof_commands(compose)["worker"]
    config = runner_config(args)
    assert config.devices_per_worker is None and config.num_workers is None
    assert "STAGEPROF_DEVICES_PER_WORKER" not in env_of(compose["services"]["worker"])


def test_every_stageprof_service_builds_the_same_image() -> None:
    services = BASE["services"]
    assert {services[n]["image"] for n in STAGEPROF_SERVICES} == {"stageprof:latest"}
    assert all(services[n]["build"] == "." for n in STAGEPROF_SERVICES)


def test_the_gpu_override_reserves_nvidia_gpus_for_gpu_workers() -> None:
    worker = GPU["services"]["worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    (args,) = stageprof_commands(GPU)["worker"]
    assert args.gpus and runner_config(args).use_gpus
    assert env_of(worker)["STAGEPROF_USE_GPUS"] == "1"
    # CUDA jax, built under its own tag: the CPU image of the other services stays as it is.
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert worker["build"]["args"]["EXTRAS"] in extras
    assert worker["image"] != BASE["services"]["worker"]["image"]
    assert {GPU["services"][n]["image"] for n in ("migrate", "api")} == {"stageprof:latest"}
    (cpu_args,) = stageprof_commands(BASE)["worker"]
    assert not cpu_args.gpus


def test_the_dockerfile_installs_every_package_and_runs_the_cli() -> None:
    text = (ROOT / "Dockerfile").read_text()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["stageprof"] == "cli.main:main"
    included = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = {
        src for line in text.splitlines() if line.startswith("COPY ") for src in line.split()[1:-1]
    }
    assert {pattern.rstrip("*") for pattern in included} <= copied
    assert pyproject["project"]["readme"] in copied
    assert re.search(r"^ARG EXTRAS", text, re.M)  # the GPU override's build argument
    (cmd,) = re.findall(r"^CMD (\[.*\])$", text, re.M)
    words = yaml.safe_load(cmd)
    assert parse(stageprof_args(words) or []).command == "serve"
