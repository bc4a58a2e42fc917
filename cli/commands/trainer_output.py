"""What `plan --for maxtext|jaxpp` prints: the trainer's settings beside stageprof's plan."""

from typing import Any

from rich.console import Console

from schemas import Plan
from schemas.trainer_export import (
    ExportUnavailable,
    jaxpp_export,
    maxtext_export,
    maxtext_gap,
    maxtext_yaml,
)


def trainer_json(plan: Plan) -> dict[str, Any]:
    """The `--json` keys of the plan's target: `maxtext` (the MaxText keys -> values, the
    predicted times, why not, or the reason there is none) or `jaxpp` (marks, schedule)."""
    if plan.target == "jaxpp":
        return {"jaxpp": jaxpp_export(plan)}
    if plan.target != "maxtext" or plan.maxtext is None:
        return {}
    try:
        return {"maxtext": maxtext_export(plan)}
    except ExportUnavailable as err:
        return {"maxtext": {"settings": None, "reason": str(err), "summary": str(err)}}


def print_trainer(console: Console, plan: Plan) -> None:
    """The MaxText settings (YAML and overrides) and the gap to the unrestricted plan, or
    JaxPP's snippet, for a plan made `--for` one of them; nothing otherwise."""
    if plan.target == "jaxpp":
        out = jaxpp_export(plan)
        console.print("[bold]JaxPP[/]: paste next to your model", highlight=False)
        console.print(out["snippet"], highlight=False, markup=False, end="", soft_wrap=True)
        if "note" in out:
            console.print(f"[yellow]note:[/] {out['note']}", highlight=False)
        return
    mt = plan.maxtext
    if plan.target != "maxtext" or mt is None:
        return
    if not mt.feasible:
        console.print(f"[bold]MaxText[/]: [red]{maxtext_gap(mt)}[/]", highlight=False)
        return
    console.print("[bold]MaxText[/] settings (YAML):", highlight=False)
    console.print(maxtext_yaml(mt), highlight=False, markup=False, end="", soft_wrap=True)
    console.print("as overrides:", highlight=False)
    console.print(maxtext_export(plan)["overrides"], highlight=False, markup=False, soft_wrap=True)
    console.print(maxtext_gap(mt), highlight=False, markup=False, soft_wrap=True)
