"""Today's searches beside an earlier commit's default search, interleaved on one machine.

A target stated against a figure measured on another day ("at most 2x today's default-search
time (23.7 s)", issue 38) needs that figure's command run again beside ours: the machines
here change speed from day to day. Each round runs, in an order rotated round by round, with
`--pause` seconds before each run:
- baseline: `bench/time_to_plan.py --only ours` of `--baseline` (a commit; checked out as a
  detached git worktree under the work dir, its code imported through PYTHONPATH, which the
  local Ray's actors inherit, with this checkout's venv: the commit must run on today's
  dependencies);
- today: the same command at this checkout;
- counts: `bench/mesh_axes_time_to_plan.py --micro-batches M --global-batch G
  --skip-exhaustive` at this checkout (its own default search, then the counts + mesh-axes
  job).

Usage: python bench/baseline_side_by_side.py [--baseline a7ad1d8] [--rounds 5] [--pause 15]
       [--micro-batches 4,8,16,32] [--global-batch 32] [--quick]
The last line printed is one JSON object with every run's figures and the ratios of means.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # bench/common.py (the script's directory is on sys.path)

KINDS = ("baseline", "today", "counts")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="a7ad1d8", help="commit of the baseline side")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pause", type=float, default=15.0, help="seconds before each run")
    parser.add_argument("--micro-batches", default="4,8,16,32", help="the counts searched")
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--work-dir", help="where the runs' output goes (default: a temp dir)")
    parser.add_argument(
        "--quick", action="store_true", help="every run at 1 block and tiny widths (smoke tests)"
    )
    return parser.parse_args(argv)


def commands(args: argparse.Namespace, tree: Path) -> dict[str, tuple[list[str], Path, dict]]:
    """Each side's command line, working directory and environment."""
    python, root, env = sys.executable, common.ROOT, dict(os.environ)
    old_env = {**env, "PYTHONPATH": os.pathsep.join([str(tree), env.get("PYTHONPATH", "")])}
    small = ["--quick", "--layers", "1"] if args.quick else []
    default = ["bench/time_to_plan.py", "--only", "ours", *small]
    counts = ["bench/mesh_axes_time_to_plan.py", "--micro-batches", args.micro_batches]
    counts += ["--global-batch", str(args.global_batch), "--skip-exhaustive", *small]
    return {
        "baseline": ([python, str(tree / default[0]), *default[1:]], tree, old_env),
        "today": ([python, str(root / default[0]), *default[1:]], root, env),
        "counts": ([python, str(root / counts[0]), *counts[1:]], root, env),
    }


def last_json(text: str) -> dict[str, Any]:
    """The JSON object a bench script prints as its last line."""
    return dict(json.loads(text.strip().splitlines()[-1]))


def figures(kind: str, out: dict[str, Any]) -> dict[str, Any]:
    """One run's figures: wall seconds and stages measured (and the counts run's default)."""
    if kind != "counts":
        ours = out["ours"]
        return {"wall_s": ours["wall_s"], "measured": ours["measured"], "commit": out["commit"]}
    default, mesh = out["default"], out["mesh"]
    return {
        "wall_s": mesh["wall_s"],
        "measured": mesh["measured"],
        "rounds": mesh["search"]["rounds"],
        "plan_ms": mesh["predicted_iteration_ms"],
        "default_wall_s": default["wall_s"],
        "default_measured": default["measured"],
        "default_plan_ms": default["predicted_iteration_ms"],
        "commit": out["commit"],
    }


def run_rounds(args: argparse.Namespace, work: Path, tree: Path) -> list[dict[str, Any]]:
    """Every round's runs (one dict per round, by side), rotating the order."""
    cmds = commands(args, tree)
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = KINDS[r % 3 :] + KINDS[: r % 3]
        got: dict[str, Any] = {}
        for kind in order:
            time.sleep(args.pause)
            argv, cwd, env = cmds[kind]
            log = work / f"{kind}-{r + 1}.log"
            done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
            log.write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
            if done.returncode != 0:
                raise SystemExit(f"{kind} run {r + 1} failed (rc {done.returncode}): see {log}")
            got[kind] = figures(kind, last_json(done.stdout))
            common.logger.warning("round %d %s: %.1f s", r + 1, kind, got[kind]["wall_s"])
        rounds.append(got)
    return rounds


def mean(rounds: list[dict[str, Any]], kind: str, name: str = "wall_s") -> float:
    return float(statistics.mean(r[kind][name] for r in rounds))


def report(args: argparse.Namespace, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Print each round side by side and the means; the JSON figures."""
    rows: list[tuple[Any, ...]] = []
    for i, r in enumerate(rounds, 1):
        b, t, c = r["baseline"], r["today"], r["counts"]
        rows.append(
            (
                f"round {i}: wall s (measured)",
                f"{b['wall_s']:.1f} ({b['measured']})",
                f"{t['wall_s']:.1f} ({t['measured']})",
                f"{c['default_wall_s']:.1f} ({c['default_measured']})",
                f"{c['wall_s']:.1f} ({c['measured']})",
            )
        )
    means = {k: mean(rounds, k) for k in KINDS}
    means["counts_default"] = mean(rounds, "counts", "default_wall_s")
    rows.append(
        (
            "mean wall s",
            means["baseline"],
            means["today"],
            means["counts_default"],
            means["counts"],
        )
    )
    names = (f"baseline {args.baseline}", "today", "its default", "counts + mesh")
    common.console().print(common.side_by_side("interleaved time to plan", rows, names))
    ratios: dict[str, Any] = {
        "counts_over_baseline": means["counts"] / means["baseline"],
        "counts_over_today": means["counts"] / means["today"],
        "counts_over_its_default": means["counts"] / means["counts_default"],
        "per_round_counts_over_baseline": [
            r["counts"]["wall_s"] / r["baseline"]["wall_s"] for r in rounds
        ],
    }
    common.console().print(
        "counts / baseline {counts_over_baseline:.2f}x   counts / today "
        "{counts_over_today:.2f}x   counts / its default {counts_over_its_default:.2f}x".format(
            **ratios
        )
    )
    return {"baseline": args.baseline, "rounds": rounds, "means": means, **ratios}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_logging()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="stageprof-baseline-"))
    work.mkdir(parents=True, exist_ok=True)
    tree = work / f"tree-{args.baseline}"
    if not tree.exists():
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), args.baseline],
            cwd=common.ROOT,
            check=True,
            capture_output=True,
        )
    try:
        rounds = run_rounds(args, work, tree)
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(tree)],
            cwd=common.ROOT,
            check=False,
            capture_output=True,
        )
    common.emit_json(report(args, rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
