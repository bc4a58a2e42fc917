"""bench/trainer_plans.py at a tiny size: MaxText's plan beside the unrestricted one."""

from tests.support.scripts import run_script


def test_trainer_plans_smoke() -> None:
    out = run_script("trainer_plans.py", "--layers", "4", "--micro-batches", "4")
    assert [c["cluster"] for c in out["cases"]] == ["1x4", "2x4"]
    for case in out["cases"]:
        settings = case["maxtext_settings"]
        stages = settings["ici_pipeline_parallelism"] * settings["dcn_pipeline_parallelism"]
        assert (
            stages * settings["num_pipeline_repeats"] * settings["num_layers_per_pipeline_stage"]
            == 4
        )
        assert case["maxtext_s"] > 0 and case["unrestricted_s"] > 0
        assert case["summary"].startswith("MaxText's best:")
