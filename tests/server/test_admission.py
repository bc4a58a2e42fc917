"""Refused at the door: what a runner would fail on is a 422 before anything is stored.

Each refused request is checked to leave the jobs and models unchanged, through the API and
in the database; the candidate count the API computes is checked against the planner's own
enumeration, and the server's zoo mirror against `client.zoo`.
"""

import json
import random
from typing import Any

import httpx
import pytest

from client.zoo import make as make_zoo
from planner.candidates import enumerate_candidates
from schemas import ClusterSpec, LayerSpec, ModelSpec, PlanOptions
from schemas.candidate_count import count_candidates
from schemas.limits import DEFAULT_MAX_CANDIDATES, MAX_CANDIDATES_ENV, max_candidates
from schemas.sharding import MeshFacts, ShardingStrategy
from server.admission import ZOO_MESH_FACTS
from server.zoo_limits import DEFAULTS, MAX_VALUES, PRESETS, WRESNET_BLOCKS, spec_shape
from tests.server.factories import exported_chain_spec
from tests.support.databases import RowCounts

CLUSTER = {"num_hosts": 1, "devices_per_host": 4}


def _counts(api: httpx.Client, row_counts: RowCounts) -> tuple[int, int, int, int]:
    """(jobs, models) as the API lists them, then as the database holds them."""
    rows = row_counts()
    jobs = len(api.get("/v1/jobs", params={"limit": 200}).json()["items"])
    models = len(api.get("/v1/models").json())
    return jobs, models, rows["jobs"], rows["models"]


def refused(
    api: httpx.Client, row_counts: RowCounts, body: dict[str, Any], field: str, *words: str
) -> str:
    """POST `body`, expect a 422 naming `field` whose message has `words`; nothing stored."""
    before = _counts(api, row_counts)
    r = api.post("/v1/plans", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    fields = [e["field"] for e in detail]
    assert field in fields, detail
    msg = next(e["msg"] for e in detail if e["field"] == field)
    for w in words:
        assert w in msg, msg
    assert _counts(api, row_counts) == before
    return msg


def _long_chain(num_layers: int) -> ModelSpec:
    """`exported_chain_spec` of `num_layers` layers, its middle layers sharing one exported program
    (exporting 1024 distinct layers would take most of a minute)."""
    first, middle, last = exported_chain_spec(num_layers=3, width=2).layers

    def wired(layer: LayerSpec, i: int, prev: str, out: str) -> LayerSpec:
        names = {layer.inputs[0].name: prev}
        return layer.model_copy(
            update={
                "name": f"chain_layer{i}",
                "inputs": [layer.inputs[0].model_copy(update={"name": prev})],
                "outputs": [layer.outputs[0].model_copy(update={"name": out})],
                "params": [layer.params[0].model_copy(update={"name": f"w{i}"})],
                "saved": [names.get(n, n) for n in layer.saved],
                "grad_inputs": [names.get(n, n) for n in layer.grad_inputs],
            }
        )

    n = num_layers
    layers = [first, *(wired(middle, i, f"h{i - 1}", f"h{i}") for i in range(1, n - 1))]
    layers.append(wired(last, n - 1, f"h{n - 2}", "loss"))
    spec = exported_chain_spec(num_layers=3, width=2)
    return ModelSpec(name="long", inputs=spec.inputs, layers=layers, loss="loss")


def test_a_1024_layer_model_is_refused_with_its_count_and_the_cap(
    api: httpx.Client, row_counts: RowCounts
) -> None:
    spec = _long_chain(1024)
    count = count_candidates(1024, ClusterSpec(**CLUSTER), PlanOptions(), spec.micro_batch_size)
    assert count.exact and count.total > DEFAULT_MAX_CANDIDATES
    body = {"model": spec.model_dump(mode="json"), "cluster": CLUSTER}
    msg = refused(api, row_counts, body, "model.layers", str(count.total), "20000")
    assert MAX_CANDIDATES_ENV in msg and "1024 layers" in msg


def test_a_huge_zoo_model_is_refused(api: httpx.Client, row_counts: RowCounts) -> None:
    body = {"zoo": "gpt", "config": {"num_layers": 1000}, "cluster": CLUSTER}
    layers, mb = spec_shape("gpt", {"num_layers": 1000})
    count = count_candidates(layers, ClusterSpec(**CLUSTER), PlanOptions(), mb).total
    refused(api, row_counts, body, "zoo.config.num_layers", str(count), "over the cap")


def test_the_cap_is_a_setting(
    api: httpx.Client, row_counts: RowCounts, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {"zoo": "gpt", "config": {"num_layers": 2}, "cluster": CLUSTER}
    count = count_candidates(4, ClusterSpec(**CLUSTER), PlanOptions(), 8).total
    monkeypatch.setenv(MAX_CANDIDATES_ENV, str(count - 1))
    refused(api, row_counts, body, "zoo.config.num_layers", f"{count} stage", f"cap of {count - 1}")
    monkeypatch.setenv(MAX_CANDIDATES_ENV, str(count))
    assert api.post("/v1/plans", json=body).status_code == 202


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_a_bad_cap_setting_is_named(value: str) -> None:
    with pytest.raises(ValueError, match=MAX_CANDIDATES_ENV):
        max_candidates({MAX_CANDIDATES_ENV: value})
    assert max_candidates({}) == DEFAULT_MAX_CANDIDATES


@pytest.mark.parametrize(
    ("cluster", "manual", "words"),
    [
        ({"num_hosts": 1, "devices_per_host": 8}, [[1, 3]], "3 device(s) do not divide the 8"),
        ({"num_hosts": 1, "devices_per_host": 8}, [[1, 16]], "does not fit"),
        ({"num_hosts": 4, "devices_per_host": 2}, [[3, 2]], "3 hosts do not divide the 4"),
        ({"num_hosts": 4, "devices_per_host": 2}, [[2, 1]], "whole hosts"),
        ({"num_hosts": 1, "devices_per_host": 4}, [[1, 2], [1, 2]], "listed twice"),
    ],
)
def test_manual_submeshes_must_divide_the_cluster(
    api: httpx.Client, row_counts: RowCounts, cluster: dict, manual: list, words: str
) -> None:
    options = {"submesh_space": "manual", "manual_submeshes": manual}
    body = {"zoo": "gpt", "config": {"num_layers": 2}, "cluster": cluster, "options": options}
    index = len(manual) - 1
    refused(api, row_counts, body, f"options.manual_submeshes.{index}", words)


def test_manual_submeshes_must_cover_the_cluster(api: httpx.Client, row_counts: RowCounts) -> None:
    options = {"submesh_space": "manual", "manual_submeshes": [[1, 1]]}
    cluster = {"num_hosts": 1, "devices_per_host": 8}
    body = {"zoo": "gpt", "config": {"num_layers": 2}, "cluster": cluster, "options": options}
    refused(api, row_counts, body, "options.manual_submeshes", "8 devices with 4 stage(s)")
    good = dict(options, manual_submeshes=[[1, 1], [1, 2], [1, 4], [1, 8]])
    assert api.post("/v1/plans", json=body | {"options": good}).status_code == 202


@pytest.mark.parametrize(
    ("memory", "ok"),
    [(2**70, False), (2**44 + 1, False), (2**20 - 1, False), (1000, False), (2**20, True)],
)
def test_device_memory_bounds(
    api: httpx.Client, row_counts: RowCounts, memory: int, ok: bool
) -> None:
    body = {
        "zoo": "gpt",
        "config": {"num_layers": 2},
        "cluster": CLUSTER | {"device_memory_bytes": memory},
    }
    if ok:
        assert api.post("/v1/plans", json=body).status_code == 202
    else:
        refused(api, row_counts, body, "cluster.device_memory_bytes")


def test_the_largest_device_memory_is_accepted(api: httpx.Client) -> None:
    body = {"zoo": "mlp", "config": {"preset": "tiny"}, "cluster": {"device_memory_bytes": 2**44}}
    r = api.post("/v1/plans", json=body)
    assert r.status_code == 202
    assert api.get(r.json()["url"]).json()["cluster"]["device_memory_bytes"] == 2**44


@pytest.mark.parametrize(
    ("zoo", "config", "field", "words"),
    [
        ("gpt", {"hidden_size": 2**20}, "zoo.config.hidden_size", "at most 65536"),
        ("mlp", {"batch_size": 10**6}, "zoo.config.batch_size", "at most 65536"),
        ("gpt", {"hidden_size": 66, "num_heads": 4}, "zoo.config.num_heads", "divisible"),
        ("moe", {"expert_group_size": 100}, "zoo.config.expert_group_size", "multiple"),
        ("wresnet", {"num_layers": 11}, "zoo.config.num_layers", "one of [6, 10, 18"),
        (
            "wresnet",
            {"num_layers": 18, "width_factor": 2},
            "zoo.config.width_factor",
            "basic blocks",
        ),
    ],
)
def test_zoo_sizes_and_rules(
    api: httpx.Client, row_counts: RowCounts, zoo: str, config: dict, field: str, words: str
) -> None:
    refused(api, row_counts, {"zoo": zoo, "config": config, "cluster": CLUSTER}, field, words)


def test_zoo_micro_batch_is_checked(api: httpx.Client, row_counts: RowCounts) -> None:
    options = {"num_microbatches": 4, "global_batch_size": 12}  # micro-batch 3, gpt traces 8
    body = {"zoo": "gpt", "config": {"num_layers": 2}, "cluster": CLUSTER, "options": options}
    refused(api, row_counts, body, "options.global_batch_size", "micro-batch 8")


def test_options_with_no_candidate_are_refused(api: httpx.Client, row_counts: RowCounts) -> None:
    options = {"config_space": "data_parallel_only", "strategies": ["megatron"]}
    body = {"zoo": "gpt", "config": {"num_layers": 2}, "cluster": CLUSTER, "options": options}
    refused(api, row_counts, body, "options", "no stage candidate")


def test_cheap_rules_come_before_the_programs(api: httpx.Client, row_counts: RowCounts) -> None:
    spec = exported_chain_spec(num_layers=2).model_dump(mode="json")
    spec["layers"][0]["forward"] = "%%% not base64"
    body = {"model": spec, "cluster": CLUSTER | {"device_memory_bytes": 2**70}}
    refused(api, row_counts, body, "cluster.device_memory_bytes")


def test_openapi_shows_the_limits(api: httpx.Client) -> None:
    doc = api.get("/openapi.json").json()
    op = doc["paths"]["/v1/plans"]["post"]
    assert "STAGEPROF_MAX_CANDIDATES" in op["description"] and "20000" in op["description"]
    params = {p["name"]: p for p in op["parameters"]}
    key = params["Idempotency-Key"]
    assert key["in"] == "header" and key["schema"]["anyOf"][0]["pattern"]
    assert params["new"]["in"] == "query"
    assert {"200", "202", "409", "422"} <= set(op["responses"])
    schemas = doc["components"]["schemas"]
    memory = schemas["RequestedCluster"]["properties"]["device_memory_bytes"]
    assert (memory["minimum"], memory["maximum"]) == (2**20, 2**44)
    manual = schemas["PlanOptions"]["properties"]["manual_submeshes"]["anyOf"][0]
    assert manual["maxItems"] == 64 and "divid" in json.dumps(schemas["PlanOptions"])
    assert "STAGEPROF_MAX_CANDIDATES" in schemas["PlanOptions"]["description"]
    assert schemas["JobCreated"]["properties"]["deduplicated"]["type"] == "boolean"


AXES = ["data", "fsdp", "tensor", "context", "expert"]
SHARDINGS = [
    ShardingStrategy(name="mine", mesh_axes={"fsdp": -1, "tensor": 2}),
    ShardingStrategy(name="four", mesh_axes={"data": 2, "expert": 2}, rules={"batch": ("data",)}),
]


def test_the_count_is_the_planners() -> None:
    """`count_candidates` in closed form equals `len(enumerate_candidates(...).keys)`."""
    rng = random.Random(15)
    for _ in range(150):
        num_layers = rng.randint(1, 10)
        spec = exported_chain_spec(num_layers=num_layers, batch=rng.choice([1, 2, 4, 6, 8]))
        flops = [rng.choice([0.0, 1.0, 3.0, rng.random() * 10]) for _ in range(num_layers)]
        spec = spec.model_copy(
            update={
                "layers": [
                    layer.model_copy(update={"flops": f})
                    for layer, f in zip(spec.layers, flops, strict=True)
                ]
            }
        )
        cluster = ClusterSpec(
            num_hosts=rng.randint(1, 5), devices_per_host=rng.choice([1, 2, 4, 8])
        )
        space = rng.choice(["power_of_two", "small_power_of_two", "all", "manual"])
        manual = None
        if space == "manual":
            per_host = cluster.devices_per_host
            singles = [(1, d) for d in (1, 2, 4, 8) if d <= per_host]
            wholes = [(h, per_host) for h in range(2, cluster.num_hosts + 1)]
            manual = rng.sample(singles + wholes, rng.randint(1, len(singles + wholes)))
        options = PlanOptions(
            submesh_space=space,
            manual_submeshes=manual,
            config_space=rng.choice(["all", "single_node_model_parallel", "data_parallel_only"]),
            strategies=rng.sample(["data", "megatron", "fsdp"], rng.randint(0, 3)),
            mesh_axes=rng.sample(AXES, rng.randint(1, 5)),
            tensor_across_hosts=rng.random() < 0.5,
            shardings=rng.choice([[], SHARDINGS]),
            layer_imbalance_tolerance=rng.choice([None, 0.1, 0.5, 1.0, 3.0]),
        )
        want = len(enumerate_candidates(spec, cluster, options).keys)
        facts = spec.mesh_facts
        got = count_candidates(
            num_layers, cluster, options, spec.micro_batch_size, flops, facts=facts
        )
        assert got.exact and got.total == want, (cluster, options, flops)
        bound = count_candidates(num_layers, cluster, options, spec.micro_batch_size, facts=facts)
        assert bound.total >= want and bound.exact == (options.layer_imbalance_tolerance is None)
        unknown = count_candidates(num_layers, cluster, options, spec.micro_batch_size, flops)
        assert unknown.total >= want


def test_counting_is_cheap_for_the_largest_request() -> None:
    cluster = ClusterSpec(num_hosts=1024, devices_per_host=1024)
    options = PlanOptions(submesh_space="all", layer_imbalance_tolerance=0.5)
    count = count_candidates(1024, cluster, options, 2**20, [1.0] * 1024)
    assert count.exact and count.total > 10**9


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_the_zoo_mirror_matches_the_zoo(name: str) -> None:
    zoo = pytest.importorskip("client.zoo")  # imports jax; the server never does
    model = zoo.get(name)
    assert DEFAULTS[name] == dict(model.defaults)
    assert PRESETS[name] == {k: dict(v) for k, v in model.presets.items()}
    for values in [model.defaults, *model.presets.values()]:
        for key, value in values.items():
            assert value <= MAX_VALUES[key], (name, key)
    assert set(model.defaults) <= set(MAX_VALUES)
    if name == "wresnet":
        stages = pytest.importorskip("client.zoo.wresnet").STAGES
        assert WRESNET_BLOCKS == {n: (sum(b), bottleneck) for n, (b, bottleneck) in stages.items()}


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("mlp", {"preset": "tiny", "num_layers": 3}),
        ("gpt", {"num_layers": 2, "hidden_size": 32, "batch_size": 4}),
        ("moe", {"num_layers": 2, "hidden_size": 32, "seq_len": 16}),
        ("wresnet", {"num_layers": 10, "image_size": 8, "num_channels": 4, "width_factor": 1}),
    ],
)
def test_the_zoo_shape_is_what_the_runner_builds(name: str, config: dict) -> None:
    zoo = pytest.importorskip("client.zoo")
    spec = zoo.build(name, **config)
    assert spec_shape(name, config) == (spec.num_layers, spec.micro_batch_size)


GPT = {"zoo": "gpt", "config": {"num_layers": 2}, "cluster": CLUSTER}


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        (
            {"shardings": [{"name": "mine", "mesh_axes": {"data": 2, "model": 2}}]},
            "options.shardings.0.mesh_axes.model.[key]",
            ("data", "tensor"),
        ),
        (
            {"shardings": [{"name": "mine", "mesh_axes": {"data": 3, "tensor": 2}}]},
            "options.shardings.0.mesh_axes",
            ("product 6", "[1, 2, 4]"),
        ),
        (
            {"shardings": [{"name": "m", "mesh_axes": {"data": -1, "fsdp": -1}}]},
            "options.shardings.0.mesh_axes",
            ("at most one mesh axis may be -1",),
        ),
        (
            {
                "shardings": [
                    {"name": "m", "mesh_axes": {"data": 4}, "rules": {"embed": ["fsdp", "model"]}}
                ]
            },
            "options.shardings.0.rules",
            ("rule 'embed'", "unknown mesh axis 'model'"),
        ),
        (
            {"mesh_axes": ["data"], "mesh_rules": {"batch": ["data", "fsdp", "data"]}},
            "options.mesh_rules",
            ("rule 'batch'", "'data' is used twice"),
        ),
        ({"mesh_axes": ["data"], "mesh_rules": "nope"}, "options.mesh_rules", ("maxtext",)),
        ({"mesh_axes": ["data", "pipeline"]}, "options.mesh_axes.1", ("tensor",)),
    ],
)
def test_bad_sharding_rules_are_refused_naming_the_field(
    api: httpx.Client, row_counts: RowCounts, options: dict, field: str, words: tuple[str, ...]
) -> None:
    refused(api, row_counts, GPT | {"options": options}, field, *words)


def test_good_sharding_rules_are_accepted(api: httpx.Client) -> None:
    options = {
        "strategies": [],
        "mesh_axes": ["data", "fsdp", "tensor"],
        "shardings": [{"name": "mine", "mesh_axes": {"fsdp": -1, "tensor": 2}}],
    }
    assert api.post("/v1/plans", json=GPT | {"options": options}).status_code == 202


@pytest.mark.parametrize("name", sorted(ZOO_MESH_FACTS))
def test_the_zoo_mesh_facts_are_the_models(name: str) -> None:
    """The door's table of zoo mesh facts equals what each zoo model's inputs and logical
    axes say (`ModelSpec.mesh_facts` reads the same)."""
    built = make_zoo(name)
    inputs = [(tuple(v.shape), str(v.dtype)) for v in built.batch.values()]
    assert ZOO_MESH_FACTS[name] == MeshFacts.of(inputs, built.logical_axes.values())


def test_microbatch_search_is_accepted_for_a_zoo_model(
    api: httpx.Client, row_counts: RowCounts
) -> None:
    """The runner traces a zoo model with a symbolic batch dimension: every count goes."""
    options = {"num_microbatches": 4, "microbatch_search": "auto"}
    body = {"zoo": "gpt", "config": {"num_layers": 2}, "cluster": CLUSTER, "options": options}
    before = row_counts()["jobs"]
    r = api.post("/v1/plans", json=body)
    assert r.status_code == 202, r.text
    assert row_counts()["jobs"] == before + 1


@pytest.mark.parametrize(
    ("options", "words"),
    [
        # the model (exported_chain_spec) is traced at 4 with no symbolic batch dimension
        (
            {"num_microbatches": 2, "microbatch_search": [1, 2, 4]},
            ("without a symbolic batch dimension", "[2, 8]", "counts [1, 4]"),
        ),
        ({"num_microbatches": 2, "microbatch_search": [3]}, ("[3] do not divide", "batch 8")),
        ({"microbatch_search": [2], "search": "prune"}, ("estimate search", "'prune'")),
    ],
)
def test_bad_microbatch_search_is_a_422_naming_it(
    api: httpx.Client, row_counts: RowCounts, options: dict[str, Any], words: tuple[str, ...]
) -> None:
    body = {"model": exported_chain_spec(num_layers=3).model_dump(mode="json"), "cluster": CLUSTER}
    refused(api, row_counts, body | {"options": options}, "options.microbatch_search", *words)


def test_microbatch_search_of_the_models_own_size_needs_no_symbolic_batch(
    api: httpx.Client,
) -> None:
    options = {"num_microbatches": 2, "microbatch_search": [2]}
    body = {"model": exported_chain_spec(num_layers=3).model_dump(mode="json"), "cluster": CLUSTER}
    assert api.post("/v1/plans", json=body | {"options": options}).status_code == 202


def test_the_cap_counts_the_sizes_searched(
    api: httpx.Client, row_counts: RowCounts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each count's candidates are those at its micro-batch size (a data-parallel size must
    divide it): micro-batches of 2 and 1 have fewer than the traced 8."""
    options = {"num_microbatches": 4, "microbatch_search": [16, 32]}  # sizes 2 and 1
    body = {"zoo": "gpt", "config": {"num_layers": 2}, "cluster": CLUSTER, "options": options}
    cluster = ClusterSpec(**CLUSTER)
    own, at_2 = (count_candidates(4, cluster, PlanOptions(), mb).total for mb in (8, 2))
    assert at_2 < own
    monkeypatch.setenv(MAX_CANDIDATES_ENV, str(at_2 - 1))
    refused(api, row_counts, body, "zoo.config.num_layers", f"{at_2} stage", "over the cap")
    monkeypatch.setenv(MAX_CANDIDATES_ENV, str(at_2))
    assert api.post("/v1/plans", json=body).status_code == 202
