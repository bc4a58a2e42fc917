"""Smoke tests of the bench/ scripts at tiny settings: each ends with one JSON line carrying
its figures. Wall times are never asserted (the machine is shared); what the figures must
satisfy whatever the timing is."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.databases import postgres_url
from tests.support.scripts import run_script

RUN_KEYS = {"candidates", "distinct_stages", "measured", "compiles", "pruned", "wall_s", "plan"}
BREAKDOWN_KEYS = {"compile_forward_s", "compile_backward_s", "compile_apply_grad_s"}


@pytest.mark.ray
@pytest.mark.slow
def test_time_to_plan(tmp_path: Path) -> None:
    work = tmp_path / "runs"
    args = ("--layers", "2", "--quick", "--micro-batches", "4")
    out = run_script("time_to_plan.py", *args, "--work-dir", str(work))
    assert {"ratio", "same_plan", "plan_gap", "config_space", "strategies"} <= set(out)
    # the two identical blocks are one stage ours measures once and the exhaustive way twice
    assert out["exhaustive_same_stage_spread"]["stages_measured_more_than_once"] >= 1
    assert out["config_space"] == "data_parallel_only" and out["strategies"] == ["data"]
    ours, exhaustive = out["ours"], out["exhaustive"]
    assert RUN_KEYS <= set(ours) and RUN_KEYS <= set(exhaustive)
    assert BREAKDOWN_KEYS <= set(ours["breakdown"])
    # the exhaustive way measures every candidate on its own; ours each distinct stage at
    # most once (the two identical blocks are one stage)
    assert exhaustive["measured"] == exhaustive["candidates"] == ours["candidates"]
    skipped = ours["pruned"] + ours["estimated"]
    assert ours["measured"] + skipped == ours["distinct_stages"] < ours["candidates"]
    # the estimate search: layer profiles, then the stages of the plans that could be best
    search = ours["search"]
    assert search["mode"] == "estimate" and search["layer_profiles"] > 0
    assert search["layer_profiles"] + search["verified"] == ours["measured"]
    assert exhaustive["search"] is None
    assert ours["compiles"] == 3 * (ours["measured"] + ours["failed"])
    # the exhaustive run compiles every candidate: no compilation cache
    assert exhaustive["cache_hits"] == 0 and 0 <= ours["cache_hits"] <= ours["compiles"]
    assert isinstance(out["same_plan"], bool) and out["ratio"] > 0
    # our plan costed on the exhaustive table: `plan_gap` is against the exhaustive run's own
    # plan, chosen by simulated time, so it may be negative; on the table of medians it is
    # against that table's optimum under Alpa's objective (the DP's), never below it
    assert isinstance(out["plan_gap"], float)
    medians = out["plan_gap_on_medians"]
    assert medians["ours_gap"] >= -1e-9 and medians["exhaustive_plan_gap"] >= -1e-9
    # compared with the stored exhaustive run instead of running it again
    (work / "run.log").write_text(json.dumps(out) + "\n")
    again = run_script("time_to_plan.py", *args, "--only", "ours", "--exhaustive-from", str(work))
    assert again["exhaustive_from"]["dir"] == str(work)
    assert again["exhaustive"]["wall_s"] == exhaustive["wall_s"]
    assert again["plan_gap_on_medians"]["ours_gap"] >= -1e-9 and again["ratio"] > 0


@pytest.mark.ray
@pytest.mark.slow
def test_compile_cache() -> None:
    out = run_script("compile_cache.py", "--layers", "1", "--quick")
    cold, warm = out["cold"], out["warm"]
    assert cold["status"] == warm["status"] == "done"
    assert cold["modules"] == 3 * cold["measured"] > 0 and cold["cache_hits"] == 0
    # fresh actors, the cache warm: every module the cold job compiled too is loaded (the
    # searches may measure different stages: timings differ from job to job)
    assert warm["cache_hits"] >= warm["modules_measured_before"] > 0
    assert cold["modules_measured_before"] == 0
    assert cold["cache_files"] > 0 and warm["cache_files"] >= cold["cache_files"]
    assert {"wall_ratio", "compile_ratio", "loadavg_before", "same_plan"} <= set(out)


@pytest.mark.ray
@pytest.mark.slow
def test_warm_replan() -> None:
    out = run_script("warm_replan.py", "--layers", "1", "--quick", "--repeats", "1")
    keys = {"cold_s", "warm_s", "warm_by_model_id_s", "idle_sleep_s", "same_plan", "goal_met"}
    assert keys <= set(out)
    assert out["warm_measured"] == 0  # every profile stored: nothing measured again
    assert out["same_plan"] is True
    assert out["idle_sleep_s"] == 0.2


@pytest.mark.ray
@pytest.mark.slow
def test_repeatability() -> None:
    out = run_script("repeatability.py", "--layers", "1", "--quick")
    sizes = out["per_submesh_size"]
    assert set(sizes) == {"1", "2", "4"}
    for fig in sizes.values():
        assert fig["stages"] > 0
        assert fig["median_abs_rel_diff_median"] >= 0 and fig["median_abs_rel_diff_mean"] >= 0


@pytest.mark.ray
@pytest.mark.slow
def test_multi_host() -> None:
    out = run_script("multi_host.py", "--layers", "1", "--quick", "--packing-devices", "2")
    configs = out["hosts"]["configs"]
    assert len(configs) == 2
    for row in configs:
        assert row["status"] == ["ok", "ok"], row
        # one program across two processes on two nodes, the same program as in one
        assert len({p.split(":")[0] for p in row["processes"]}) == 2
        assert row["flops_equal"] and row["peak_equal"]
        assert row["step_ratio"] > 0
    one, packed = out["packing"]["one shape"], out["packing"]["packed"]
    assert one["status"] == packed["status"] == "done"
    assert one["measured"] == packed["measured"] > 0
    assert one["processes_started"] == 1 < packed["processes_started"]
    assert out["packing"]["packed_vs_one_shape"] > 0


@pytest.mark.postgres
def test_profile_table() -> None:
    base = postgres_url().rsplit("/", 1)[0]
    url = os.environ.get("STAGEPROF_BENCH_TEST_POSTGRES_URL", f"{base}/stageprof_bench_test")
    out = run_script("profile_table.py", "--quick", "--url", url, "--requests", "5")
    assert out["candidates"] == 5000 and out["profiles"] > 0
    assert {"p50_ms", "p95_ms"} <= set(out["shapes"]["job, by cost"])
    assert {"worst_p95_ms", "goal_met", "goal_p95_ms"} <= set(out)
    # the keyset page returns the same rows as the OFFSET page at every depth
    assert out["keyset_vs_offset"] and all(d["same_rows"] for d in out["keyset_vs_offset"])


@pytest.mark.slow
def test_stage_fidelity() -> None:
    out = run_script("stage_fidelity.py", "--quick")
    variants = out["variants"]
    assert set(variants) == {"plain", "remat"}
    for name, v in variants.items():
        # each block stays its own layer, with its jax.checkpoint inside (remat variant only)
        assert v["layers"] == ["embed", "block0", "block1", "head"]
        assert v["remat_in_block_layers"] is (name == "remat")
        ours, direct, old = v["ours"], v["direct"], v["old"]
        # ours' backward runs from the stash: the FLOPs of a direct jax.vjp, not more
        assert 0.95 * direct["backward_flops"] <= ours["backward_flops"]
        assert ours["backward_flops"] <= 1.05 * direct["backward_flops"]
        # the stash is the direct VJP's residuals (parameters excluded, batch inputs kept)
        assert abs(ours["intermediate_size"] / direct["stash_bytes"] - 1) <= 0.10
        if name == "plain":  # the old form re-ran the forward in backward, stashing inputs
            assert old["backward_flops"] > 1.1 * ours["backward_flops"]
            assert old["stash_bytes"] < ours["intermediate_size"]
        # the CPU peak rule: arguments + outputs + temporaries - alias; XLA's figure omits temps
        for module, m in v["ours_memory"].items():
            assert m["peak_rule"] == m["args_outs_temps"], module
            assert m["xla_peak"] <= m["peak_rule"], module
        assert v["ours_memory"]["backward"]["temp"] > 0
        assert ours["backward_peak"] == v["ours_memory"]["backward"]["peak_rule"]
        assert ours["backward_time_s"] > 0 and direct["backward_time_s"] > 0
    plain, remat = variants["plain"]["ours"], variants["remat"]["ours"]
    # remat keeps less from forward to backward and recomputes in backward
    assert remat["intermediate_size"] < plain["intermediate_size"]
    assert remat["backward_flops"] > plain["backward_flops"]
    deterministic = {c["check"]: c["ok"] for c in out["checks"] if "FLOPs" in c["check"]}
    assert deterministic and all(deterministic.values()), out["checks"]


def test_upload_check() -> None:
    out = run_script("upload_check.py", "--blocks", "2", "--quick")
    assert out["fingerprints_equal"] is True and out["problems"] == 0
    assert out["backends_initialised"] == []  # the server's check touches no device
    assert out["distinct_program_pairs"] == 3 and out["layers"] == 4


@pytest.mark.ray
@pytest.mark.slow
def test_microbatch_search() -> None:
    out = run_script("microbatch_search.py", "--layers", "1", "--quick", "--counts", "2,4")
    per_count = out["per_count"]
    assert set(per_count) == {"2", "4"}
    assert out["chosen_count"] in (2, 4)
    times = [v["ms"] for v in per_count.values() if v["ms"] is not None]
    assert out["auto_ms"] == min(times)  # never slower than any count searched
    assert out["fixed_ms"] is not None and all(r > 0 for r in out["ratio_total"])
    assert sum(v["measured"] for v in per_count.values()) > 0  # one job, every size stored


@pytest.mark.ray
@pytest.mark.slow
def test_maxtext_time_to_plan() -> None:
    """`--for maxtext` runs the estimate search (not every candidate) and answers a MaxText
    plan whose settings obey MaxText's constraints, beside the default search's plan."""
    from tests.planner.test_trainers import check_maxtext_constraints

    args = ("--layers", "2", "--quick", "--micro-batches", "4", "--devices-per-host", "2")
    out = run_script("maxtext_time_to_plan.py", *args)
    default, maxtext = out["runs"]["default"], out["runs"]["maxtext"]
    assert default["search_mode"] == maxtext["search_mode"] == "estimate"
    assert maxtext["candidates"] == default["candidates"]
    assert maxtext["measured"] < maxtext["distinct_stages"]  # not every candidate
    assert maxtext["maxtext_feasible"] and "maxtext_s" not in default
    check_maxtext_constraints(maxtext["maxtext_settings"], 1, 2)
    assert maxtext["maxtext_settings"]["pipeline_parallel_layers"] == 2
    assert maxtext["maxtext_s"] == pytest.approx(
        maxtext["maxtext_pipeline_s"] + maxtext["maxtext_outside_s"]
    )
    assert out["maxtext_over_default"] > 0


@pytest.mark.ray
@pytest.mark.slow
def test_mesh_axes_time_to_plan() -> None:
    """The mesh-axes space (and counts 2 and 4) searched beside the default search, on the
    same model: more candidates, every one of its plan's configs a mesh-axes config, both by
    estimates."""
    args = ("--layers", "1", "--quick", "--micro-batches", "2,4", "--global-batch", "8")
    out = run_script("mesh_axes_time_to_plan.py", *args, "--skip-exhaustive")
    default, mesh = out["default"], out["mesh"]
    # the breakdown counts every stage measured, at both micro-batch sizes of the mesh side
    assert default["profiles"] == default["measured"] and mesh["profiles"] == mesh["measured"]
    assert default["search"]["mode"] == mesh["search"]["mode"] == "estimate"
    assert mesh["candidates"] >= out["mesh_candidates_big"] > default["candidates"]
    assert mesh["configs"] and all(c.endswith("/maxtext") for c in mesh["configs"])
    assert not any(c.endswith("/maxtext") for c in default["configs"])
    assert out["mesh_over_default"] > 0 and "small-exhaustive" not in out


@pytest.mark.ray
@pytest.mark.slow
def test_baseline_side_by_side(tmp_path: Path) -> None:
    """An earlier commit's default search beside today's and the counts job, interleaved:
    here the baseline is this checkout's HEAD, checked out as a worktree that the script
    removes again; every side reports its commit and the ratios are of the means."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    args = ("--baseline", head, "--rounds", "1", "--pause", "0", "--quick")
    args += ("--micro-batches", "2,4", "--global-batch", "8", "--work-dir", str(tmp_path))
    out = run_script("baseline_side_by_side.py", *args)
    (one,) = out["rounds"]
    assert set(one) == {"baseline", "today", "counts"}
    assert one["baseline"]["commit"] == head  # run from the worktree, at that commit
    assert one["counts"]["measured"] > one["counts"]["default_measured"] > 0
    assert out["counts_over_baseline"] == pytest.approx(
        one["counts"]["wall_s"] / one["baseline"]["wall_s"]
    )
    worktrees = subprocess.run(
        ["git", "worktree", "list"], capture_output=True, text=True, check=True
    ).stdout
    assert str(tmp_path) not in worktrees
