"""scripts/ray_cluster.sh: a Ray cluster of several nodes on this one machine, each offering
the `stageprof_devices` resource, that a driver joins through the printed RAY_ADDRESS, and
whose `stop` leaves none of its processes behind (and no other Ray's)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.cluster.ray_env import DEVICE_RESOURCE

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(300)]  # about 20 s

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ray_cluster.sh"

NODES_OF_THE_CLUSTER = """
import json, sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
print(json.dumps([{"alive": n["Alive"], "resources": n["Resources"]} for n in ray.nodes()]))
"""


def free_port() -> int:
    """A free port for the head, low enough for the script's dashboard-agent ports above it."""
    while True:
        with socket.socket() as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        if port < 65000:
            return port


def processes_naming(text: str) -> dict[int, str]:
    """Live processes (zombies excluded) whose command line contains `text`: pid → argv[0]."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if text.encode() in cmdline and stat[stat.rindex(")") + 2] not in "ZX":
            found[int(entry.name)] = cmdline.split(b"\0")[0].decode(errors="replace")
    return found


@pytest.fixture
def cluster_env() -> Iterator[dict[str, str]]:
    """The script's environment: a cluster directory and a head port of this test's own (a
    short directory: Ray's socket paths must fit in 107 bytes), Ray's defaults otherwise."""
    directory = tempfile.mkdtemp(prefix="sprc-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "STAGEPROF_"))}
    env |= {"STAGEPROF_RAY_CLUSTER_DIR": directory, "RAY_CLUSTER_PORT": str(free_port())}
    yield env
    # Whatever happened, stop what the test started (the script is idempotent).
    subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=60)
    shutil.rmtree(directory, ignore_errors=True)


def run_script(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_two_nodes_offer_their_devices_and_stop_leaves_no_raylet(
    cluster_env: dict[str, str],
) -> None:
    directory = cluster_env["STAGEPROF_RAY_CLUSTER_DIR"] + "/"
    started = run_script(cluster_env, "start", "2", "2")
    assert started.returncode == 0, started.stdout + started.stderr
    (address,) = [
        line.removeprefix("export RAY_ADDRESS=")
        for line in started.stdout.splitlines()
        if line.startswith("export RAY_ADDRESS=")
    ]
    assert address.endswith(":" + cluster_env["RAY_CLUSTER_PORT"])
    assert run_script(cluster_env, "start", "2", "2").returncode == 1  # one at a time

    # A driver joins the printed address and sees both nodes, each with its devices.
    nodes = subprocess.run(
        [sys.executable, "-c", NODES_OF_THE_CLUSTER, address],
        env=cluster_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert nodes.returncode == 0, nodes.stderr
    found = json.loads(nodes.stdout.strip().splitlines()[-1])
    assert [n["alive"] for n in found] == [True, True]
    assert [n["resources"].get(DEVICE_RESOURCE) for n in found] == [2.0, 2.0]
    assert [n["resources"].get("CPU") for n in found] == [2.0, 2.0]
    raylets = {p for p, exe in processes_naming(directory).items() if exe.endswith("/raylet")}
    assert len(raylets) == 2

    stopped = run_script(cluster_env, "stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert processes_naming(directory) == {}
    assert not any(Path(f"/proc/{pid}").exists() for pid in raylets)  # reaped, not zombies
    assert not Path(directory).exists()
