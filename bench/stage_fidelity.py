"""Stage fidelity: what stageprof measures for a stage vs a direct `jax.vjp` and vs the old
layer form, on a plain-JAX transformer traced with `client.trace`.

The model (written here, not a zoo model): token embedding, N pre-LN blocks (causal
attention + MLP, each inside `client.layer(f"block{i}")`), a head (final LN, logits, mean
cross-entropy). Two variants: plain, and `jax.checkpoint` around each block body (inside its
layer marker, so each block stays its own layer). The stage is the WHOLE model (every layer,
embedding to loss) on one CPU device, data strategy. Three columns per variant:

- ours: `workers.measure.stage.measure_stage_on` of the traced spec (layer pairs: forward with
  residuals, backward from them).
- direct: `jax.vjp` of the same un-exported Python loss; forward = jit returning the VJP's
  leaves, backward = jit applying the unflattened VJP to the loss cotangent.
- old: the previous layer form rebuilt here: each layer's plain forward exported
  (`serialize(vjp_order=1)`), the stage = `jax.vjp` of the composed `Exported.call`s (its
  backward re-runs the forward; its stash is the layers' inputs).

Times: `repeats` timed runs after `warmup` (each ended by `block_until_ready`), the median
(`workers.measure.timing.time_runs`, as `measure_stage_on` runs it); each column is measured again
in each of `--rounds` rounds (in a rotating order) and the median of the rounds' figures is
reported (FLOPs and bytes are the same every round). As a check on a busy machine, the
three backwards are also timed in turns (`--interleaved` turns, order rotating): the paired
ratio is the median of ours/direct over the turns. Compile seconds are wall seconds of lower
+ compile (as `compile_seconds`) and, beside them, this process's CPU seconds.

Usage: python bench/stage_fidelity.py [--blocks 4] [--hidden 256] [--seq 128] [--batch 8]
    [--heads 4] [--vocab 512] [--rounds 3] [--repeats 5] [--warmup 1] [--interleaved 15]
    [--quick]
The last line printed is one JSON object with every figure.
"""

import argparse
import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import common  # bench/common.py (the script's directory is on sys.path)
from direct_vjp import compile_timed, flops, memory, residuals, time_module, timed_build
from direct_vjp import slot as _slot

DEFAULTS = {"blocks": 4, "hidden": 256, "seq": 128, "batch": 8, "heads": 4, "vocab": 512}
QUICK = {"blocks": 2, "hidden": 32, "seq": 16, "batch": 2, "heads": 2, "vocab": 64}
EPS = 1e-5

# targets of the checks (ours vs direct, ours vs old, remat vs plain)
MAX_BWD_FLOPS_RATIO = 1.05
MAX_BWD_TIME_RATIO = 1.15
MAX_STASH_REL_DIFF = 0.10
MAX_COMPILE_RATIO_VS_OLD = 0.60  # backward compile at least 40 % down


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, value in DEFAULTS.items():
        parser.add_argument(f"--{name}", type=int, help=f"default {value} (--quick {QUICK[name]})")
    parser.add_argument("--rounds", type=int, help="measurements per column (default 3; quick 1)")
    parser.add_argument("--repeats", type=int, help="timed runs per module (default 5; quick 2)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per module")
    parser.add_argument(
        "--interleaved", type=int, help="turns of the interleaved backward timing (15; quick 2)"
    )
    parser.add_argument("--quick", action="store_true", help="a tiny model, one round (smoke)")
    return parser.parse_args(argv)


# ----- the model -----------------------------------------------------------------------------
def init_params(cfg: dict[str, int]) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    h, v, s = cfg["hidden"], cfg["vocab"], cfg["seq"]
    keys = iter(jax.random.split(jax.random.key(0), 8 * cfg["blocks"] + 8))

    def normal(*shape: int) -> jax.Array:
        return jax.random.normal(next(keys), shape, jnp.float32) * 0.02

    def block() -> dict[str, jax.Array]:
        p = {f"w{n}": normal(h, h) for n in "qkvo"}
        p |= {f"b{n}": jnp.zeros((h,)) for n in "qkvo"}
        p |= {"w1": normal(h, 4 * h), "b1": jnp.zeros((4 * h,))}
        p |= {"w2": normal(4 * h, h), "b2": jnp.zeros((h,))}
        for ln in ("ln1", "ln2"):
            p |= {f"{ln}_scale": jnp.ones((h,)), f"{ln}_bias": jnp.zeros((h,))}
        return p

    return {
        "embed": {"wte": normal(v, h), "wpe": normal(s, h)},
        "blocks": [block() for _ in range(cfg["blocks"])],
        "head": {"lnf_scale": jnp.ones((h,)), "lnf_bias": jnp.zeros((h,)), "w_out": normal(h, v)},
    }


def make_batch(cfg: dict[str, int]) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    kt, kl = jax.random.split(jax.random.key(1))
    shape, v = (cfg["batch"], cfg["seq"]), cfg["vocab"]
    return {
        "tokens": jax.random.randint(kt, shape, 0, v, dtype=jnp.int32),
        "labels": jax.random.randint(kl, shape, 0, v, dtype=jnp.int32),
    }


def layer_norm(x: Any, scale: Any, bias: Any) -> Any:
    import jax
    import jax.numpy as jnp

    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + EPS) * scale + bias


def embed(p: dict, tokens: Any) -> Any:
    import jax.numpy as jnp

    return jnp.take(p["wte"], tokens, axis=0) + p["wpe"][None]


def block(heads: int, p: dict, x: Any) -> Any:
    """Pre-LN causal self-attention then MLP, each with its residual."""
    import jax
    import jax.numpy as jnp

    b, s, h = x.shape
    y = layer_norm(x, p["ln1_scale"], p["ln1_bias"])
    q, k, v = ((y @ p[f"w{n}"] + p[f"b{n}"]).reshape(b, s, heads, h // heads) for n in "qkv")
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(h // heads)
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    attn = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, s, h)
    x = x + attn @ p["wo"] + p["bo"]
    y = layer_norm(x, p["ln2_scale"], p["ln2_bias"])
    return x + jax.nn.gelu(y @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def head_loss(p: dict, x: Any, labels: Any) -> Any:
    import jax
    import jax.numpy as jnp

    logits = layer_norm(x, p["lnf_scale"], p["lnf_bias"]) @ p["w_out"]
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


def block_fn(cfg: dict[str, int], remat: bool) -> Callable[[dict, Any], Any]:
    import jax

    body = partial(block, cfg["heads"])
    return jax.checkpoint(body) if remat else body


def make_loss(cfg: dict[str, int], remat: bool) -> Callable[[dict, dict], Any]:
    """The model's loss, with one `client.layer` per piece (the block's remat inside it)."""
    import client

    body = block_fn(cfg, remat)

    def loss(params: dict, batch: dict) -> Any:
        with client.layer("embed"):
            h = embed(params["embed"], batch["tokens"])
        for i, bp in enumerate(params["blocks"]):
            with client.layer(f"block{i}"):
                h = body(bp, h)
        with client.layer("head"):
            return head_loss(params["head"], h, batch["labels"])

    return loss


# ----- measuring helpers (bench/direct_vjp.py) -------------------------------------------
class VJPProgram:
    """`jax.vjp` of `loss(params, batch)` w.r.t. params carried between two jitted programs:
    forward returns the VJP's leaves, backward unflattens them and applies the cotangent.
    `stash_bytes` = bytes of the unique (by id, at trace time) leaves that are not
    parameters (batch inputs the VJP keeps count)."""

    def __init__(self, loss: Callable[[Any, Any], Any], params: Any, batch: Any) -> None:
        import jax
        import jax.numpy as jnp

        self.params, self.batch = params, batch
        self.tree: Any = None
        self.stash_bytes = 0
        self.stash_count = 0
        self.leaf_bytes = 0

        def forward(p: Any, b: Any) -> list:
            _, vjp = jax.vjp(lambda q: loss(q, b), p)
            leaves, self.tree = jax.tree_util.tree_flatten(vjp)
            self.stash_count, self.stash_bytes, self.leaf_bytes = residuals(leaves, p)
            return leaves

        def backward(leaves: list, ct: Any) -> Any:
            return jax.tree_util.tree_unflatten(self.tree, leaves)(ct)[0]

        self.forward, self.backward = forward, backward
        self.cotangent = jnp.ones((), jnp.float32)
        self.run_backward: Callable[[], Any] = lambda: None

    def measure(self, warmup: int, repeats: int) -> dict[str, Any]:
        fwd, fwd_s, fwd_cpu = compile_timed(self.forward, self.params, self.batch)
        leaves = fwd(self.params, self.batch)
        bwd, bwd_s, bwd_cpu = compile_timed(self.backward, leaves, self.cotangent)
        self.run_backward = lambda: bwd(leaves, self.cotangent)  # the last round's, kept
        samples = time_module(self.run_backward, warmup, repeats, "backward (reference)")
        return {
            "forward_flops": flops(fwd),
            "backward_flops": flops(bwd),
            "backward_time_s": common.median(samples),
            "backward_samples_s": samples,
            "forward_compile_s": fwd_s,
            "backward_compile_s": bwd_s,
            "forward_compile_cpu_s": fwd_cpu,
            "backward_compile_cpu_s": bwd_cpu,
            "stash_bytes": self.stash_bytes,
            "stash_values": self.stash_count,
            # jit drops arguments its program never reads: VJP leaves the backward ignores
            "unread_leaf_bytes": self.leaf_bytes + self.cotangent.nbytes - memory(bwd)["argument"],
            "forward_memory": memory(fwd),
            "backward_memory": memory(bwd),
        }


def old_form_loss(cfg: dict[str, int], remat: bool, params: dict, batch: dict) -> Callable:
    """The previous layer form: each layer's plain forward exported with
    `serialize(vjp_order=1)` and deserialized (identical blocks share one export), composed
    as `Exported.call`s; differentiating it uses the exported VJPs (which take the primals)."""
    import jax

    def export(fn: Callable, *args: Any) -> jax.export.Exported:
        structs = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)
        exp = jax.export.export(jax.jit(fn), platforms=("cpu",))(*structs)
        return jax.export.deserialize(bytearray(exp.serialize(vjp_order=1)))

    body = block_fn(cfg, remat)
    emb = export(embed, params["embed"], batch["tokens"])
    h = jax.eval_shape(embed, params["embed"], batch["tokens"])
    blk = export(body, params["blocks"][0], h)
    head = export(head_loss, params["head"], h, batch["labels"])

    def loss(p: dict, b: dict) -> Any:
        x = emb.call(p["embed"], b["tokens"])
        for bp in p["blocks"]:
            x = blk.call(bp, x)
        return head.call(p["head"], x, b["labels"])

    return loss


class OursModules:
    """The stage's modules compiled once more as `measure_stage_on` builds them
    (`StageModules`), for what its result does not carry: the raw memory_analysis() next to
    the peak rule (`workers.measure.memory.module_memory`), compile CPU seconds, and a call of the
    backward on the forward's stash (arrays made as `measure_stage_on` makes them)."""

    def __init__(self, spec: Any, options: Any) -> None:
        self.spec, self.options = spec, options
        self.memory: dict[str, dict[str, int]] = {}
        self.run_backward: Callable[[], Any] = lambda: None

    def measure(self) -> dict[str, float]:
        import jax

        from workers.measure.compose import compose_stage
        from workers.measure.memory import module_memory
        from workers.measure.sharding import make_mesh, stage_shardings
        from workers.measure.stage_modules import StageModules
        from workers.measure.timing import random_array

        spec = self.spec
        program = compose_stage(spec, 0, spec.num_layers - 1)
        mesh = make_mesh(jax.devices()[:1], DATA_CONFIG())
        shardings = stage_shardings(mesh, DATA_CONFIG(), program.params, program.inputs)
        modules = StageModules(program, shardings, self.options.optimizer)
        compiled, out = {}, {}
        for kind, build in (
            ("forward", modules.compile_forward),
            ("backward", modules.compile_backward),
            ("apply_grad", modules.compile_apply_grad),
        ):
            with _slot("compile"):
                module, wall, cpu = timed_build(build)
            compiled[kind] = module.compiled
            out[f"{kind}_compile_cpu_s"] = cpu
            out[f"{kind}_compile_wall_s"] = wall
            peak = module_memory(compiled[kind]).peak
            self.memory[kind] = memory(compiled[kind]) | {"peak_rule": peak}
        params = [random_array(s, i) for i, s in enumerate(modules.param_structs)]
        inputs = [random_array(s, 1000 + i) for i, s in enumerate(modules.input_structs)]
        outs, stash, _ = compiled["forward"](params, inputs)
        cot = tuple(jax.numpy.ones_like(o) for o in outs)
        self.run_backward = lambda: compiled["backward"](params, stash, cot)
        return out


def interleaved(runs: dict[str, Callable[[], Any]], warmup: int, n: int) -> dict[str, list]:
    """Time the backwards in turns (the order rotating every turn), so that a load that
    comes and goes on the machine falls on all of them alike: `n` samples each."""
    import jax

    from workers.measure.timing import clock_for

    clock = clock_for(jax.devices())
    names = list(runs)
    samples: dict[str, list[float]] = {name: [] for name in names}
    with _slot("timing"):
        for _ in range(warmup):
            for run in runs.values():
                jax.block_until_ready(run())
        for i in range(n):
            k = i % len(names)
            for name in names[k:] + names[:k]:
                t0 = clock()
                jax.block_until_ready(runs[name]())
                samples[name].append(clock() - t0)
    return samples


def DATA_CONFIG() -> Any:  # noqa: N802 - a constant built lazily (schemas imports pydantic)
    from schemas import ShardingConfig

    return ShardingConfig(logical_mesh=(1, 1), strategy="data")


def measure_ours(spec: Any, options: Any) -> dict[str, Any]:
    from schemas import ClusterSpec, ModuleKind, SubmeshShape
    from workers.measure.stage import measure_stage_on

    one = SubmeshShape(hosts=1, devices_per_host=1)
    cluster = ClusterSpec(num_hosts=1, devices_per_host=1, device_kind="cpu")
    result = measure_stage_on(spec, 0, spec.num_layers - 1, one, DATA_CONFIG(), cluster, options)
    if not result.ok:
        raise RuntimeError(f"ours: {result.status.value}: {result.error}")
    fwd, bwd = result.module(ModuleKind.forward), result.module(ModuleKind.backward)
    assert fwd is not None and bwd is not None
    return {
        "forward_flops": fwd.flops,
        "backward_flops": bwd.flops,
        "backward_time_s": bwd.compute_cost,
        "backward_samples_s": list(bwd.compute_cost_samples_s),
        "forward_compile_s": fwd.compile_seconds,
        "backward_compile_s": bwd.compile_seconds,
        "intermediate_size": result.intermediate_size,
        "forward_peak": fwd.peak_memory,
        "backward_peak": bwd.peak_memory,
        "forward_temp": fwd.temp_buffer_size,
        "backward_temp": bwd.temp_buffer_size,
    }


TIMED = (
    "backward_time_s",
    "forward_compile_s",
    "backward_compile_s",
    "forward_compile_cpu_s",
    "backward_compile_cpu_s",
)


def merge_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One column from its rounds: timed figures as the median over rounds (each round's
    figures kept), the rest from the first round (they are the same every round)."""
    out = dict(rounds[0])
    for key in (k for k in TIMED if k in out):
        out[key] = common.median(r[key] for r in rounds)
        out[f"{key}_rounds"] = [r[key] for r in rounds]
    out["backward_samples_s"] = [r["backward_samples_s"] for r in rounds]
    for key in ("backward_flops", "forward_flops", "intermediate_size", "stash_bytes"):
        if key in out and any(r[key] != out[key] for r in rounds):
            out[f"{key}_varies"] = [r[key] for r in rounds]
    return out


def measure_variant(
    cfg: dict[str, int], remat: bool, rounds: int, warmup: int, repeats: int, interleaved_runs: int
) -> dict[str, Any]:
    import client
    from schemas import PlanOptions

    params, batch = init_params(cfg), make_batch(cfg)
    loss = make_loss(cfg, remat)
    spec = client.trace(loss, params, batch, name="fidelity_remat" if remat else "fidelity")
    expected = ["embed", *(f"block{i}" for i in range(cfg["blocks"])), "head"]
    names = [layer.name for layer in spec.layers]
    if names != expected:
        raise RuntimeError(f"the traced layers are {names}, expected {expected}")
    blocks = spec.layers[1:-1]
    remat_in_layers = all("checkpoint" in layer.jaxpr or "remat" in layer.jaxpr for layer in blocks)
    options = PlanOptions(
        repeats=repeats,
        max_repeats=repeats,
        warmup=warmup,
        prune=False,
        candidate_timeout_s=3600,
        schedule="1f1b",  # forward + backward, as jax.vjp: no split backward
    )
    ours_again = OursModules(spec, options)
    direct = VJPProgram(loss, params, batch)
    old = VJPProgram(old_form_loss(cfg, remat, params, batch), params, batch)
    measures: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("ours", lambda: measure_ours(spec, options) | ours_again.measure()),
        ("direct", lambda: direct.measure(warmup, repeats)),
        ("old", lambda: old.measure(warmup, repeats)),
    ]
    columns: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in measures}
    for r in range(rounds):  # the order rotates from round to round
        k = r % len(measures)
        for name, measure in measures[k:] + measures[:k]:
            columns[name].append(measure())
    out: dict[str, Any] = {name: merge_rounds(rs) for name, rs in columns.items()}
    out["layers"] = names
    out["rounds"] = rounds
    out["remat_in_block_layers"] = remat_in_layers
    out["block_residuals"] = [len(layer.residuals) for layer in blocks]
    out["block_saved"] = [list(layer.saved) for layer in blocks]
    out["ours_memory"] = ours_again.memory
    turns = interleaved(
        {"ours": ours_again.run_backward, "direct": direct.run_backward, "old": old.run_backward},
        warmup,
        interleaved_runs,
    )
    out["interleaved"] = {
        "runs": interleaved_runs,
        "samples_s": turns,
        "median_s": {name: common.median(t) for name, t in turns.items()},
        "paired_ours_over_direct": common.median(
            a / b for a, b in zip(turns["ours"], turns["direct"], strict=True)
        ),
        "paired_old_over_direct": common.median(
            a / b for a, b in zip(turns["old"], turns["direct"], strict=True)
        ),
    }
    return out


# ----- report --------------------------------------------------------------------------------
def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def checks(variants: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each check: name, value, target, ok."""
    out: list[dict[str, Any]] = []

    def add(name: str, value: float, target: str, ok: bool) -> None:
        out.append({"check": name, "value": value, "target": target, "ok": bool(ok)})

    for variant, v in variants.items():
        ours, direct, old = v["ours"], v["direct"], v["old"]
        r = ratio(ours["backward_flops"], direct["backward_flops"])
        add(
            f"{variant}: bwd FLOPs ours/direct",
            r,
            f"<= {MAX_BWD_FLOPS_RATIO}",
            r <= MAX_BWD_FLOPS_RATIO,
        )
        r = ratio(ours["backward_time_s"], direct["backward_time_s"])
        add(
            f"{variant}: bwd time ours/direct",
            r,
            f"<= {MAX_BWD_TIME_RATIO}",
            r <= MAX_BWD_TIME_RATIO,
        )
        r = v["interleaved"]["paired_ours_over_direct"]
        add(
            f"{variant}: bwd time ours/direct, interleaved (paired)",
            r,
            f"<= {MAX_BWD_TIME_RATIO}",
            r <= MAX_BWD_TIME_RATIO,
        )
        r = ratio(ours["intermediate_size"], direct["stash_bytes"])
        add(
            f"{variant}: intermediate_size / direct residual bytes",
            r,
            f"1 ± {MAX_STASH_REL_DIFF}",
            abs(r - 1) <= MAX_STASH_REL_DIFF,
        )
        for what, key in (("", "backward_compile_s"), (" CPU", "backward_compile_cpu_s")):
            r = ratio(ours[key], old[key])
            add(
                f"{variant}: bwd compile{what} s ours/old",
                r,
                f"<= {MAX_COMPILE_RATIO_VS_OLD}",
                r <= MAX_COMPILE_RATIO_VS_OLD,
            )
    plain, remat = variants["plain"]["ours"], variants["remat"]["ours"]
    r = ratio(remat["intermediate_size"], plain["intermediate_size"])
    add("remat/plain intermediate_size (ours)", r, "< 1", r < 1)
    r = ratio(remat["backward_flops"], plain["backward_flops"])
    add("remat/plain bwd FLOPs (ours)", r, "> 1", r > 1)
    return out


def ratios(v: dict[str, Any]) -> dict[str, float]:
    ours, direct, old = v["ours"], v["direct"], v["old"]
    return {
        "bwd_flops_ours_over_direct": ratio(ours["backward_flops"], direct["backward_flops"]),
        "bwd_time_ours_over_direct": ratio(ours["backward_time_s"], direct["backward_time_s"]),
        "stash_ours_over_direct": ratio(ours["intermediate_size"], direct["stash_bytes"]),
        "bwd_compile_ours_over_old": ratio(ours["backward_compile_s"], old["backward_compile_s"]),
        "bwd_compile_cpu_ours_over_old": ratio(
            ours["backward_compile_cpu_s"], old["backward_compile_cpu_s"]
        ),
        "bwd_compile_ours_over_direct": ratio(
            ours["backward_compile_s"], direct["backward_compile_s"]
        ),
        "bwd_flops_old_over_direct": ratio(old["backward_flops"], direct["backward_flops"]),
        "bwd_time_old_over_direct": ratio(old["backward_time_s"], direct["backward_time_s"]),
        "bwd_time_ours_over_direct_interleaved": v["interleaved"]["paired_ours_over_direct"],
        "bwd_time_old_over_direct_interleaved": v["interleaved"]["paired_old_over_direct"],
    }


def mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def gflop(n: float) -> str:
    return f"{n / 1e9:.3f} G"


def ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms"


def secs(s: float) -> str:
    return f"{s:.2f} s"


def print_tables(cfg: dict[str, int], variants: dict[str, dict[str, Any]], figs: dict) -> None:
    from rich.table import Table

    out = common.console()
    model = ", ".join(f"{k} {n}" for k, n in cfg.items()) + ", float32"
    for variant, v in variants.items():
        ours, direct, old = v["ours"], v["direct"], v["old"]
        title = (
            f"{variant}: stage = whole model, layers 0..{len(v['layers']) - 1} "
            f"({v['layers'][0]}, {v['layers'][1]}..{v['layers'][-2]}, {v['layers'][-1]}), "
            f"1 CPU device, data; jax.checkpoint in each block layer's jaxpr: "
            f"{v['remat_in_block_layers']}; {model}"
        )
        table = Table(title=title)
        for col in ("figure", "ours", "direct jax.vjp", "old form"):
            table.add_column(col, justify="left" if col == "figure" else "right")
        rows = [
            ("forward FLOPs", *(gflop(c["forward_flops"]) for c in (ours, direct, old))),
            ("backward FLOPs", *(gflop(c["backward_flops"]) for c in (ours, direct, old))),
            (
                f"backward time (median of {v['rounds']} rounds' medians)",
                *(ms(c["backward_time_s"]) for c in (ours, direct, old)),
            ),
            (
                f"backward time, interleaved (median of {v['interleaved']['runs']})",
                *(ms(v["interleaved"]["median_s"][c]) for c in ("ours", "direct", "old")),
            ),
            (
                f"backward compile (median of {v['rounds']})",
                *(secs(c["backward_compile_s"]) for c in (ours, direct, old)),
            ),
            (
                f"backward compile, CPU s of this process (median of {v['rounds']})",
                *(secs(c["backward_compile_cpu_s"]) for c in (ours, direct, old)),
            ),
            (
                f"forward compile (median of {v['rounds']})",
                *(secs(c["forward_compile_s"]) for c in (ours, direct, old)),
            ),
            (
                "stash (intermediate_size | residual bytes)",
                mib(ours["intermediate_size"]),
                mib(direct["stash_bytes"]),
                mib(old["stash_bytes"]),
            ),
            (
                "VJP leaves the backward never reads",
                "-",
                mib(direct["unread_leaf_bytes"]),
                mib(old["unread_leaf_bytes"]),
            ),
            (
                "forward peak (ours rule | args+outs+temps-alias)",
                mib(ours["forward_peak"]),
                mib(direct["forward_memory"]["args_outs_temps"]),
                mib(old["forward_memory"]["args_outs_temps"]),
            ),
            (
                "backward peak (ours rule | args+outs+temps-alias)",
                mib(ours["backward_peak"]),
                mib(direct["backward_memory"]["args_outs_temps"]),
                mib(old["backward_memory"]["args_outs_temps"]),
            ),
            (
                "backward temp_buffer_size",
                mib(ours["backward_temp"]),
                mib(direct["backward_memory"]["temp"]),
                mib(old["backward_memory"]["temp"]),
            ),
            (
                "forward temp_buffer_size",
                mib(ours["forward_temp"]),
                mib(direct["forward_memory"]["temp"]),
                mib(old["forward_memory"]["temp"]),
            ),
        ]
        for row in rows:
            table.add_row(*row)
        out.print(table)

    table = Table(title="peak rule per module (ours): CPU peak = args + outputs + temps - alias")
    for col in ("variant", "module", "peak (ours)", "args", "outputs", "temps", "alias"):
        table.add_column(col, justify="left" if col in ("variant", "module") else "right")
    table.add_column("args+outs+temps-alias", justify="right")
    table.add_column("XLA peak_memory_in_bytes", justify="right")
    for variant, v in variants.items():
        for module, m in v["ours_memory"].items():
            table.add_row(
                variant,
                module,
                mib(m["peak_rule"]),
                *(mib(m[k]) for k in ("argument", "output", "temp", "alias")),
                mib(m["args_outs_temps"]),
                mib(m["xla_peak"]),
            )
        for name in ("direct", "old"):
            m = v[name]["backward_memory"]
            table.add_row(
                variant,
                f"{name} backward",
                "-",
                *(mib(m[k]) for k in ("argument", "output", "temp", "alias")),
                mib(m["args_outs_temps"]),
                mib(m["xla_peak"]),
            )
    out.print(table)

    table = Table(title="checks")
    for col in ("check", "value", "target", "ok"):
        table.add_column(col, justify="left" if col == "check" else "right")
    for c in figs["checks"]:
        table.add_row(c["check"], f"{c['value']:.3f}", c["target"], "yes" if c["ok"] else "NO")
    out.print(table)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_logging()
    base = QUICK if args.quick else DEFAULTS
    cfg = {k: getattr(args, k) or v for k, v in base.items()}
    rounds = args.rounds or (1 if args.quick else 3)
    repeats = args.repeats or (2 if args.quick else 5)
    turns = args.interleaved or (2 if args.quick else 15)
    if cfg["hidden"] % cfg["heads"]:
        raise SystemExit(f"--hidden {cfg['hidden']} must be divisible by --heads {cfg['heads']}")

    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.jit(lambda x: x + 1).lower(1.0).compile()  # first-compile costs outside the columns
    began = time.perf_counter()
    variants = {
        name: measure_variant(cfg, remat, rounds, args.warmup, repeats, turns)
        for name, remat in (("plain", False), ("remat", True))
    }
    figs: dict[str, Any] = {
        "model": "plain-JAX pre-LN transformer traced with client.trace",
        "config": cfg | {"dtype": "float32"},
        "stage": "whole model: embed, blocks, head (all layers), 1 CPU device, data",
        "rounds": rounds,
        "repeats": repeats,
        "warmup": args.warmup,
        "variants": variants,
        "ratios": {name: ratios(v) for name, v in variants.items()},
        "remat_over_plain": {
            "intermediate_size": ratio(
                variants["remat"]["ours"]["intermediate_size"],
                variants["plain"]["ours"]["intermediate_size"],
            ),
            "bwd_flops": ratio(
                variants["remat"]["ours"]["backward_flops"],
                variants["plain"]["ours"]["backward_flops"],
            ),
        },
    }
    figs["checks"] = checks(variants)
    figs["all_ok"] = all(c["ok"] for c in figs["checks"])
    figs["wall_s"] = round(time.perf_counter() - began, 1)
    figs["jax_version"] = jax.__version__
    figs["commit"] = common.git_commit()
    print_tables(cfg, variants, figs)
    common.emit_json(figs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
