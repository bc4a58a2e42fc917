"""Fill a Postgres store with a realistic profile table for bench/profile_table.py.

Jobs over a few dozen models (8 to 32 layers, 4 or 8 devices, 1 to 3 configs per submesh),
every (start, end, submesh, config) candidate of each job, statuses as a real run leaves
them (ok; oom for long ranges on small submeshes; pruned; a few compile errors and timeouts;
pending in running jobs), one stage profile per fingerprint shared by the jobs of a model
with the same options (reused rows), costs and memory that grow with the range and shrink
with devices, and timestamps over 30 days. Bulk inserted, then ANALYZEd.
"""

import hashlib
import math
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import common  # noqa: F401  (puts the repository on sys.path)
from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import make_url

from store import make_engine
from store.tables import JobCandidateRow, JobRow, ModelRow, StageProfileRow

BATCH = 5000
STRATEGIES = ("data", "megatron", "fsdp")
MODEL_NAMES = ("gpt", "mlp", "moe", "wresnet", "bert")


@dataclass
class FillSummary:
    """What was inserted, and ids to query with."""

    models: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    job_models: dict[str, str] = field(default_factory=dict)
    candidates: int = 0
    profiles: int = 0
    seconds: float = 0.0


def ensure_database(url: str) -> None:
    """Create the database of `url` when it does not exist (connecting to `postgres`)."""
    target = make_url(url)
    admin = create_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        exists = conn.execute(
            text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": target.database}
        ).first()
        if not exists:
            conn.exec_driver_sql(f'CREATE DATABASE "{target.database}"')
    admin.dispose()


def reset_schema(url: str, revision: str = "head") -> None:
    """Drop everything in the database's public schema, then migrate to `revision`."""
    from migrations import upgrade

    engine = make_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP SCHEMA public CASCADE")
        conn.exec_driver_sql("CREATE SCHEMA public")
    engine.dispose()
    upgrade(url, revision)


def _hash(*parts: Any) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def _result_json(fp: str, status: str, start: int, end: int, devices: int, cost: float) -> dict:
    """A stored result of realistic size (three modules with their var lists), one that
    reads back as a `StageProfileResult`."""
    names = [f"blocks/{i}/w{j}" for i in range(start, end + 1) for j in range(4)][:64]
    modules = []
    if status == "ok":
        for kind, share in (("forward", 1 / 3), ("backward", 2 / 3), ("apply_grad", 0.05)):
            modules.append(
                {
                    "module": kind,
                    "compute_cost": cost * share,
                    "peak_memory": 2**20 * (end - start + 1),
                    "temp_buffer_size": 2**16,
                    "invar_names": names,
                    "outvar_names": names[:8],
                    "invar_sizes": [65536] * len(names),
                    "outvar_sizes": [65536] * min(8, len(names)),
                    "donated_invars": [False] * len(names),
                    "compute_cost_samples_s": [cost * share] * 5,
                    "compile_seconds": 0.5 * (end - start + 1),
                    "available_memory": 16 * 2**30,
                }
            )
    return {
        "status": status,
        "fingerprint": fp,
        "key": None,
        "submesh": {"hosts": 1, "devices_per_host": devices},
        "config": {"logical_mesh": [devices, 1], "strategy": "data"},
        "num_layers": end - start + 1,
        "available_memory": 16 * 2**30,
        "module_profile_results": modules,
        "error": None if status == "ok" else f"{status}: synthetic",
    }


def _status(rng: random.Random, frac: float, devices: int, running: bool, late: bool) -> str | None:
    """How a candidate ended: `frac` is its share of the model's layers."""
    if running and late:
        return None  # pending
    if frac / devices > 0.45:
        return "oom"
    u = rng.random()
    if u < 0.02:
        return "compile_error"
    if u < 0.025:
        return "timeout"
    if frac > 0.3 and u < 0.55:
        return "pruned"
    return "ok"


class _Filler:
    def __init__(self, engine: Any, rng: random.Random, target: int) -> None:
        self.engine, self.rng, self.target = engine, rng, target
        self.summary = FillSummary()
        self.cands: list[dict] = []
        self.profiles: dict[str, dict] = {}
        self.jobs: list[dict] = []
        self.models: list[dict] = []
        self.next_cand_id = 1
        self.now = datetime.now(UTC)

    def add_models(self, n: int) -> None:
        for i in range(n):
            name = MODEL_NAMES[i % len(MODEL_NAMES)]
            layers = self.rng.choice((8, 12, 16, 24, 32))
            mid = _hash("model", i)
            self.models.append(
                {
                    "id": mid,
                    "name": f"{name}-{i}",
                    "num_layers": layers,
                    "spec": {"name": f"{name}-{i}", "num_layers": layers},
                    "created_at": self.now - timedelta(days=30),
                }
            )
            self.summary.models.append(mid)

    def add_job(self, index: int) -> None:
        rng = self.rng
        model = rng.choice(self.models)
        layers, mid = model["num_layers"], model["id"]
        devices = rng.choice((4, 8))
        variant = rng.randrange(2)  # jobs of one model and variant share profiles
        submeshes = [d for d in (1, 2, 4, 8) if d <= devices]
        configs = [1 if d == 1 else rng.randint(1, 3) for d in submeshes]
        status = rng.choices(("done", "failed", "profiling"), (0.88, 0.04, 0.08))[0]
        created = self.now - timedelta(minutes=rng.uniform(0, 30 * 24 * 60))
        jid = _hash("job", index)[:32]
        keys = []
        for m, (d, nc) in enumerate(zip(submeshes, configs, strict=True)):
            for start in range(layers):
                for end in range(start, layers):
                    if d == devices and (start, end) != (0, layers - 1):
                        continue
                    keys.extend((start, end, m, c, d) for c in range(nc))
        keys = keys[: max(1, self.target - self.summary.candidates)]
        per_layer = rng.uniform(0.002, 0.05)
        for n, (start, end, m, c, d) in enumerate(keys):
            frac = (end - start + 1) / layers
            st = _status(rng, frac, d, status == "profiling", n > 0.6 * len(keys))
            fp = _hash(mid, variant, start, end, d, c)
            row: dict[str, Any] = {
                "id": self.next_cand_id,
                "job_id": jid,
                "model_id": mid,
                "start": start,
                "end": end,
                "submesh_id": m,
                "config_id": c,
                "num_devices": d,
                "strategy": STRATEGIES[c],
                "fingerprint": fp,
                "profile_id": None,
                "reused": False,
                "status": st,
                "compute_cost": None,
                "peak_memory": None,
                "recorded_at": None,
            }
            self.next_cand_id += 1
            if st is not None:
                row["recorded_at"] = created + timedelta(seconds=5 * n)
            if st not in (None, "pruned"):
                cost = per_layer * (end - start + 1) / d**0.85 * math.exp(rng.gauss(0, 0.15))
                profile = self.profiles.get(fp)
                if profile is None:
                    profile = self._profile(fp, st, start, end, d, c, cost)
                else:
                    row["reused"] = True
                row["profile_id"] = profile["id"]
                row["status"] = profile["status"]
                row["compute_cost"] = profile["compute_cost"]
                row["peak_memory"] = profile["peak_memory"]
            self.cands.append(row)
        self.summary.candidates += len(keys)
        self.summary.jobs.append(jid)
        self.summary.job_models[jid] = mid
        self.jobs.append(
            {
                "id": jid,
                "model_id": mid,
                "status": status,
                "cluster": {"num_hosts": 1, "devices_per_host": devices},
                "options": {"num_microbatches": 8, "variant": variant},
                "total": len(keys),
                "done": sum(1 for r in self.cands[-len(keys) :] if r["status"] is not None),
                "created_at": created,
                "started_at": created,
                "finished_at": None if status == "profiling" else created + timedelta(hours=1),
            }
        )

    def _profile(
        self, fp: str, st: str, start: int, end: int, d: int, c: int, cost: float
    ) -> dict[str, Any]:
        ok = st == "ok"
        profile = {
            "id": len(self.profiles) + 1,
            "fingerprint": fp,
            "status": st,
            "compute_cost": cost if ok else None,
            "forward_cost": cost / 3 if ok else None,
            "backward_cost": 2 * cost / 3 if ok else None,
            "peak_memory": int(2**26 * (end - start + 1) / d * self.rng.uniform(0.8, 1.2)),
            "initial_var_size": int(2**24 * (end - start + 1) / d),
            "intermediate_size": int(2**22 * (end - start + 1) / d),
            "max_n_succ_stages": self.rng.randint(-1, 64) if ok else -1,
            "num_layers": end - start + 1,
            "submesh_hosts": 1,
            "submesh_devices": d,
            "mesh_dp": 1 if c == 1 else d,  # megatron: (1, d); data and fsdp: (d, 1)
            "mesh_tp": d if c == 1 else 1,
            "strategy": STRATEGIES[c],
            "device_kind": "cpu",
            "jax_version": "0.10.2",
            "compile_seconds": 0.5 * (end - start + 1),
            "error": None if ok else f"{st}: synthetic",
            "result": _result_json(fp, st, start, end, d, cost),
            "created_at": self.now,
        }
        self.profiles[fp] = profile
        return profile

    def write(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(insert(ModelRow), self.models)
            for table, rows in (
                (JobRow, self.jobs),
                (StageProfileRow, list(self.profiles.values())),
                (JobCandidateRow, self.cands),
            ):
                for i in range(0, len(rows), BATCH):
                    conn.execute(insert(table), rows[i : i + BATCH])
            for table in ("stage_profiles", "job_candidates"):
                conn.exec_driver_sql(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                    f"(SELECT max(id) FROM {table}))"
                )
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("ANALYZE")
        self.summary.profiles = len(self.profiles)


def fill(
    url: str, *, rows: int = 100_000, seed: int = 7, models: int = 40, revision: str = "head"
) -> FillSummary:
    """Reset the database at `url` (migrated to `revision`) and insert `rows` candidates."""
    import time

    began = time.perf_counter()
    ensure_database(url)
    reset_schema(url, revision)
    engine = make_engine(url)
    filler = _Filler(engine, random.Random(seed), rows)
    filler.add_models(models)
    index = 0
    while filler.summary.candidates < rows:
        filler.add_job(index)
        index += 1
    filler.write()
    engine.dispose()
    filler.summary.seconds = time.perf_counter() - began
    return filler.summary
