"""The profile-table endpoint: GET /v1/profiles latency over 100k stored profiles on Postgres.

Fills a separate Postgres database (`stageprof_bench`, created when missing, migrated to
head; see bench/profile_fill.py for the distributions), starts `stageprof serve` on it, and
times filtered, sorted pages over HTTP (limit 100): by job sorted by cost, by model + status,
by submesh/config, by layer range, unfiltered, and later pages by cursor. p50/p95 per shape.
Next to it, in-process: our keyset page (`store.queries.profile_page` with a cursor) against
the straightforward OFFSET page of the same rows (the baseline) at growing depths.

Usage: python bench/profile_table.py [--rows 100000] [--requests 200] [--quick]
         [--url postgresql+psycopg://postgres@127.0.0.1:5432/stageprof_bench] [--keep]
The last line printed is one JSON object with every figure.
"""

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common  # bench/common.py (the script's directory is on sys.path)

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/stageprof_bench"
GOAL_P95_MS = 50.0
PAGE = 100
START_TIMEOUT_S = 60.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", default=os.environ.get("STAGEPROF_BENCH_POSTGRES_URL", DEFAULT_URL)
    )
    parser.add_argument("--rows", type=int, help="candidate rows to store (100000; quick 5000)")
    parser.add_argument("--requests", type=int, help="timed requests per shape (200; quick 20)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="reuse the stored rows if present")
    parser.add_argument(
        "--revision", default="head", help="migrate to this revision (e.g. 0002: before 0003)"
    )
    parser.add_argument("--quick", action="store_true", help="5k rows, 20 requests (smoke)")
    return parser.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shapes(rng: random.Random, jobs: list[str], models: list[str]) -> dict[str, Callable]:
    """Query parameters of each timed page shape (a fresh job/model per request)."""
    return {
        "job, by cost": lambda: {"job_id": rng.choice(jobs), "sort": "compute_cost"},
        "job, by cost desc": lambda: {"job_id": rng.choice(jobs), "sort": "-compute_cost"},
        "model + status ok, by cost": lambda: {
            "model_id": rng.choice(models),
            "status": "ok",
            "sort": "compute_cost",
        },
        "model + status oom/compile_error, by memory desc": lambda: {
            "model_id": rng.choice(models),
            "status": ["oom", "compile_error"],
            "sort": "-peak_memory",
        },
        "job + submesh/config, by cost": lambda: {
            "job_id": rng.choice(jobs),
            "submesh_id": rng.choice((1, 2)),
            "config_id": 0,
            "sort": "compute_cost",
        },
        "job + layer range, by start": lambda: {
            "job_id": rng.choice(jobs),
            "start_min": 2,
            "end_max": 9,
            "sort": "start",
        },
        "model, by start": lambda: {"model_id": rng.choice(models), "sort": "start"},
        "model, recent first": lambda: {"model_id": rng.choice(models), "sort": "-recorded_at"},
        "all, by cost": lambda: {"sort": "compute_cost"},
        "all, by start": lambda: {"sort": "start"},
        "all, status pruned, recent first": lambda: {"status": "pruned", "sort": "-recorded_at"},
        "devices 4 + strategy megatron, by cost": lambda: {
            "num_devices": 4,
            "strategy": "megatron",
            "sort": "compute_cost",
        },
    }


def time_http(
    http: Any, params_of: Callable[[], dict], n: int, pages: int = 1
) -> tuple[list[float], int]:
    """`n` timed GETs of page number `pages` (earlier pages fetched untimed for the cursor)."""
    samples, rows = [], 0
    for i in range(n + 5):  # the first 5 are untimed warm-up requests
        params = params_of() | {"limit": PAGE}
        for _ in range(pages - 1):
            cursor = http.get("/v1/profiles", params=params).json()["next_cursor"]
            if cursor is None:
                break
            params = params | {"cursor": cursor}
        began = time.perf_counter()
        r = http.get("/v1/profiles", params=params)
        elapsed = time.perf_counter() - began
        r.raise_for_status()
        if i >= 5:
            rows += len(r.json()["items"])
            samples.append(elapsed * 1000)
    return samples, rows


def serve(url: str, work: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGEPROF_")}
    cmd = [sys.executable, "-m", "cli", "serve", "--port", str(port)]
    cmd += ["--database-url", url, "--log-level", "warning", "--no-migrate"]
    log = open(work / "serve.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=common.ROOT)
    return proc, f"http://127.0.0.1:{port}"


def wait_up(http: Any, proc: subprocess.Popen) -> None:
    import httpx

    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError("stageprof serve exited")
        try:
            if http.get("/healthz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("stageprof serve did not answer")
        time.sleep(0.1)


def depth_comparison(url: str, depths: list[int], repeats: int) -> list[dict[str, Any]]:
    """Our keyset page vs the OFFSET page at each depth (page number), in-process, ms."""
    from sqlalchemy import select

    from store import make_engine, make_sessionmaker
    from store.queries import PROFILE_COLUMNS, PageCursor, ProfileFilter, ProfileSort, profile_page
    from store.tables import JobCandidateRow as C
    from store.tables import StageProfileRow as P

    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    out = []
    sort = ProfileSort("compute_cost")
    with sessions() as s:
        for depth in depths:
            offset = (depth - 1) * PAGE
            naive = (
                select(*[c.label(n) for n, c in PROFILE_COLUMNS.items()])
                .select_from(C)
                .outerjoin(P, P.id == C.profile_id)
                .order_by(C.compute_cost.asc().nulls_last(), C.id.asc())
                .offset(offset)
                .limit(PAGE)
            )
            before = s.execute(naive.offset(max(0, offset - 1)).limit(1)).mappings().first()
            after = PageCursor(before["compute_cost"], before["id"]) if offset else None
            base_ms, ours_ms = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                base_rows = [dict(r) for r in s.execute(naive).mappings()]
                t1 = time.perf_counter()
                page = profile_page(s, filters=ProfileFilter(), sort=sort, limit=PAGE, after=after)
                t2 = time.perf_counter()
                base_ms.append((t1 - t0) * 1000)
                ours_ms.append((t2 - t1) * 1000)
            same = [r["id"] for r in base_rows] == [r["id"] for r in page.rows]
            out.append(
                {
                    "page": depth,
                    "keyset_p50_ms": round(common.median(ours_ms), 2),
                    "offset_p50_ms": round(common.median(base_ms), 2),
                    "same_rows": same,
                }
            )
    engine.dispose()
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_logging()
    import httpx
    from profile_fill import fill

    from store import make_engine

    rows = args.rows or (5000 if args.quick else 100_000)
    n = args.requests or (20 if args.quick else 200)
    summary = None
    if args.keep:
        summary = existing(args.url, rows)
    if summary is None:
        summary = fill(args.url, rows=rows, seed=args.seed, revision=args.revision)
    work = Path(tempfile.mkdtemp(prefix="stageprof-table-"))
    proc, base = serve(args.url, work)
    results: dict[str, Any] = {}
    rng = random.Random(args.seed)
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            wait_up(http, proc)
            for name, params_of in shapes(rng, summary.jobs, summary.models).items():
                samples, got = time_http(http, params_of, n)
                results[name] = _stats(samples, got, n)
            for name, (shape, page) in {
                "job, by cost, page 2 (cursor)": ("job, by cost", 2),
                "all, by cost, page 3 (cursor)": ("all, by cost", 3),
            }.items():
                params_of = shapes(rng, summary.jobs, summary.models)[shape]
                samples, got = time_http(http, params_of, max(5, n // 4), pages=page)
                results[name] = _stats(samples, got, max(5, n // 4))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    depths = [1, 10, 100] if args.quick else [1, 10, 100, 500, 900]
    depths = [d for d in depths if d * PAGE <= rows]
    deep = depth_comparison(args.url, depths, 5 if args.quick else 20)
    engine = make_engine(args.url)
    with engine.connect() as conn:
        version = conn.exec_driver_sql("SHOW server_version").scalar()
    engine.dispose()
    out = report(args, summary, results, deep, rows, n, version)
    common.emit_json(out)
    return 0


def existing(url: str, rows: int) -> Any:
    """The ids of an earlier fill when it holds exactly `rows` candidates, else None."""
    from profile_fill import FillSummary
    from sqlalchemy import func, select

    from store import make_engine
    from store.tables import JobCandidateRow, JobRow

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            count = conn.scalar(select(func.count()).select_from(JobCandidateRow))
            if count != rows:
                return None
            jobs = conn.execute(select(JobRow.id, JobRow.model_id)).all()
    except Exception:  # no database or no tables yet
        return None
    finally:
        engine.dispose()
    summary = FillSummary(candidates=rows)
    summary.jobs = [j for j, _ in jobs]
    summary.models = sorted({m for _, m in jobs})
    summary.job_models = dict(jobs)
    return summary


def _stats(samples: list[float], rows: int, n: int) -> dict[str, Any]:
    return {
        "p50_ms": round(common.percentile(samples, 50), 2),
        "p95_ms": round(common.percentile(samples, 95), 2),
        "max_ms": round(max(samples), 2),
        "requests": len(samples),
        "mean_rows": round(rows / max(1, len(samples)), 1),
    }


def report(
    args: argparse.Namespace,
    summary: Any,
    results: dict[str, dict[str, Any]],
    deep: list[dict[str, Any]],
    rows: int,
    n: int,
    version: str,
) -> dict[str, Any]:
    from rich.table import Table

    con = common.console()
    table = Table(title=f"GET /v1/profiles over HTTP, {rows} candidates, limit {PAGE}")
    for col in ("shape", "p50 ms", "p95 ms", "max ms", "rows/page"):
        table.add_column(col, justify="left" if col == "shape" else "right")
    for name, r in results.items():
        table.add_row(
            name, *(common.fmt(r[k]) for k in ("p50_ms", "p95_ms", "max_ms")), str(r["mean_rows"])
        )
    con.print(table)
    depth_rows = [
        (f"page {d['page']} (all, by cost), p50 ms", d["keyset_p50_ms"], d["offset_p50_ms"])
        for d in deep
    ]
    con.print(
        common.side_by_side(
            "in-process: keyset page vs OFFSET page", depth_rows, ("ours (keyset)", "OFFSET")
        )
    )
    worst = max(r["p95_ms"] for r in results.values())
    return {
        "database": "postgres " + str(version),
        "candidates": rows,
        "profiles": summary.profiles or None,
        "jobs": len(summary.jobs),
        "models": len(summary.models),
        "fill_seconds": round(summary.seconds, 1) if summary.seconds else None,
        "page_size": PAGE,
        "requests_per_shape": n,
        "shapes": results,
        "worst_p95_ms": worst,
        "goal_p95_ms": GOAL_P95_MS,
        "goal_met": worst < GOAL_P95_MS,
        "keyset_vs_offset": deep,
        "revision": args.revision,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "commit": common.git_commit(),
    }


if __name__ == "__main__":
    raise SystemExit(main())
