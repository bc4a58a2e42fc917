"""`stageprof plan --micro-batches auto` (or a list of counts): the count of micro-batches
searched at a fixed global batch, by one job (`PlanOptions.microbatch_search`).

The model is traced once with a symbolic batch dimension (`client.symbolic_batch`); the
job states it at each count's micro-batch size (`programs.spec_at_batch`), searches every
count on one measuring pool and answers with the fastest plan in simulated time, every
count's best beside it (`count_table`).
"""

import argparse
from typing import Any

from rich.table import Table

from cli.commands.zoo_args import parse_overrides
from schemas import ModelSpec, Plan


def parse_micro_batches(text: str) -> dict[str, Any]:
    """`--micro-batches`: a count ("8"), "auto", or counts to search ("4,8,16,32"), as
    PlanOptions fields."""
    text = text.strip()
    if text == "auto":
        return {"microbatch_search": "auto"}
    if "," in text:
        try:
            counts = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"counts must be integers, got {text!r}") from None
        return {"microbatch_search": counts}
    try:
        return {"num_microbatches": int(text)}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a count, 'auto' or a list like 4,8,16, got {text!r}"
        ) from None


def load_symbolic_model(args: argparse.Namespace) -> ModelSpec:
    """The model with a symbolic batch dimension: a zoo model traced so, or a spec file
    (which must carry one unless only its own size is planned)."""
    if args.model is not None:
        import programs

        return programs.verified(ModelSpec.model_validate_json(args.model.read_text()))
    from client.symbolic_batch import build_zoo_symbolic

    return build_zoo_symbolic(args.zoo, **parse_overrides(args.overrides))


def count_table(plan: Plan) -> Table:
    """Each count's best plan beside the chosen one (*)."""
    table = Table(title="micro-batches searched", title_justify="left")
    for name in ("count", "micro-batch", "iteration ms", "schedule", "stages"):
        table.add_column(name, overflow="fold")
    for o in plan.microbatch_options:
        mark = " *" if o.chosen else ""
        t = o.predicted_iteration_time_s
        table.add_row(
            f"{o.num_microbatches}{mark}",
            str(o.micro_batch_size),
            f"{t * 1e3:.3f}" if t is not None else (o.reason or "-"),
            o.schedule or "-",
            o.layout or "-",
        )
    return table
