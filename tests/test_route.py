"""Tables over the pure route function, with model files written by the gguf library."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from serve_fixtures import STRIX, bundle_maker, models, per_backend_layout, write_manifest  # noqa: F401  (models is a fixture)

from onebit.bundles import BUNDLES
from onebit.inspect import inspect_model
from onebit.manifest import Backend, Manifest
from onebit.recipes import default_recipes_path, load_recipes, parse_recipes
from onebit.launch_plan import LaunchPlan, Refusal
from onebit.route import route
from onebit.serve_flags import RouteEnv, ServeFlags, split_options

RECIPES = load_recipes(default_recipes_path())


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    make = bundle_maker(tmp_path_factory)
    return {
        "strix": make("strix", STRIX),
        "cpu": make("cpu", ["cpu"]),
        "nvidia": make("nvidia", ["cuda", "cpu"]),
        "vulkan-only": make("vulkan-only", ["vulkan"]),
        "rocm-nohad": make("rocm-nohad", ["rocm", "vulkan"], features={"rocm": []}),
        "with-env": make("with-env", ["vulkan"], envs={"vulkan": {"RADV_PERFTEST": "sam", "GGML_VK_X": "1"}}),
        "hrx-only-hrx0": make("hrx-only-hrx0", ["hrx", "vulkan"], devices={"hrx": ["HRX0"]}),
        "lean": make("lean", ["lean-vulkan", "rocm", "cpu"]),
    }


def bin_of(m, backend):
    return str(m.prefix / next(iter(per_backend_layout(backend)[1].values())))


def run(models, bundles, model="dense", bundle="strix", env=None, recipes=RECIPES, ports=(41001, 41002), **flags):
    facts = inspect_model(models[model])
    draft = inspect_model(models[flags["dflash"]]) if flags.get("dflash") else None
    long_facts = inspect_model(models[flags["long_model"]]) if flags.get("long_model") else None
    for k in ("dflash", "long_model", "mtp", "mmproj"):
        if flags.get(k):
            flags[k] = str(models.get(flags[k], flags[k]))
    f = ServeFlags(model=str(models[model]), **flags)
    renv = RouteEnv(env=env or {}, path_llama_server=None, free_ports=ports)
    return route(facts, f, bundles[bundle], renv, recipes, draft=draft, long_facts=long_facts)


def base(models, bundles, model, backend, device_flag, port="8080", host="127.0.0.1", bundle="strix"):
    argv = [bin_of(bundles[bundle], backend), "-m", str(models[model]), "--host", host, "--port", port]
    if device_flag:
        argv += ["--device", device_flag, "-ngl", "99"]
    else:
        argv += ["-ngl", "0"]
    return argv + ["--jinja"]


# --- exact command lines and environment ---------------------------------------------------------------------------

# (id, model, bundle, flags, backend, --device, extra argv after the base, env)
EXEC_TABLE = [
    ("auto-picks-vulkan-on-strix", "dense", "strix", {}, "vulkan", "Vulkan0", [], {}),
    ("auto-picks-cpu-on-cpu-bundle", "dense", "cpu", {}, "cpu", None, [], {}),
    ("auto-picks-cuda-on-nvidia", "dense", "nvidia", {}, "cuda", "CUDA0", [], {}),
    ("device-cpu-has-no-device-flag", "dense", "strix", {"device": "cpu"}, "cpu", None, [], {}),
    ("device-hrx", "dense", "strix", {"device": "hrx"}, "hrx", "HRX0", [], {}),
    ("device-rocm-plain", "dense", "strix", {"device": "rocm"}, "rocm", "ROCm0", [], {}),
    ("ctx-fa-alias-pass", "dense", "strix", {"ctx_size": 4096, "flash_attn": "on", "alias": "m1"}, "vulkan", "Vulkan0",
     ["-c", "4096", "-fa", "on", "--alias", "m1"], {}),
    ("parallel-np", "dense", "strix", {"parallel": 3}, "vulkan", "Vulkan0", ["-np", "3"], {}),
    ("rotated-auto-rocm-dense-keeps-512", "rot", "strix", {}, "rocm", "ROCm0", [], {"GGML_W4A4_TENSORS": "all"}),
    ("rotated-moe-ub1024", "rot-moe", "strix", {}, "rocm", "ROCm0", ["-ub", "1024"], {"GGML_W4A4_TENSORS": "all"}),
    ("rotated-explicit-rocm", "rot", "strix", {"device": "rocm"}, "rocm", "ROCm0", [], {"GGML_W4A4_TENSORS": "all"}),
    ("plain-moe-rocm-no-ub", "moe", "strix", {"device": "rocm"}, "rocm", "ROCm0", [], {}),
    ("dflash-block-size", "dense", "strix", {"dflash": "draft16"}, "vulkan", "Vulkan0",
     ["--spec-type", "draft-dflash", "-md", "@draft16", "-ngld", "99", "--spec-draft-n-max", "15",
      "--spec-draft-p-min", "0"], {}),
    ("dflash-default-16", "dense", "strix", {"dflash": "draft"}, "vulkan", "Vulkan0",
     ["--spec-type", "draft-dflash", "-md", "@draft", "-ngld", "99", "--spec-draft-n-max", "16",
      "--spec-draft-p-min", "0"], {}),
    ("dflash-rocm-p-min-0.4", "dense", "strix", {"dflash": "draft16", "device": "rocm"}, "rocm", "ROCm0",
     ["--spec-type", "draft-dflash", "-md", "@draft16", "-ngld", "99", "--spec-draft-n-max", "15",
      "--spec-draft-p-min", "0.4"], {}),
    ("dflash-rotated-rocm-p-min-0.4", "rot", "strix", {"dflash": "draft16"}, "rocm", "ROCm0",
     ["--spec-type", "draft-dflash", "-md", "@draft16", "-ngld", "99", "--spec-draft-n-max", "15",
      "--spec-draft-p-min", "0.4"], {"GGML_W4A4_TENSORS": "all"}),
    ("dflash-cpu-ngld-0", "dense", "cpu", {"dflash": "draft"}, "cpu", None,
     ["--spec-type", "draft-dflash", "-md", "@draft", "-ngld", "0", "--spec-draft-n-max", "16",
      "--spec-draft-p-min", "0"], {}),
    ("mtp", "dense", "strix", {"mtp": "head.gguf"}, "vulkan", "Vulkan0",
     ["--spec-type", "draft-mtp", "-md", "head.gguf", "-ngld", "99"], {}),
    ("mtp-max-p-min", "dense", "strix", {"mtp": "head.gguf", "mtp_max": 3, "mtp_p_min": 0.25}, "vulkan", "Vulkan0",
     ["--spec-type", "draft-mtp", "-md", "head.gguf", "-ngld", "99", "--spec-draft-n-max", "3",
      "--spec-draft-p-min", "0.25"], {}),
    ("mmproj", "dense", "strix", {"mmproj": "mm.gguf"}, "vulkan", "Vulkan0",
     ["--mmproj", "mm.gguf", "-b", "4096", "-ub", "4096"], {}),
    ("moe-slots-vulkan", "moe", "strix", {"moe_slots": 6}, "vulkan", "Vulkan0", ["-ot", "exps=CPU"],
     {"ONEBIT_MOE_FILE": "@moe", "ONEBIT_MOE_SLOTS": "6"}),
    # --prefill-device hrx: the hrx build's one server, decoding on its Vulkan0, prefilling on its HRX0
    ("prefill-hrx-default", "dense", "strix", {"prefill_device": "hrx"}, "hrx", "Vulkan0", [],
     {"ONEBIT_PREFILL_DEVICE": "HRX0", "ONEBIT_PREFILL_MIN_TOKENS": "1024"}),
    ("prefill-hrx-min", "dense", "strix", {"prefill_device": "hrx", "prefill_min_tokens": 300}, "hrx", "Vulkan0", [],
     {"ONEBIT_PREFILL_DEVICE": "HRX0", "ONEBIT_PREFILL_MIN_TOKENS": "300"}),
    ("extra-args-pass-through", "dense", "strix", {"extra": ("--embedding", "--temp", "0.7")}, "vulkan", "Vulkan0",
     ["--embedding", "--temp", "0.7"], {}),
    ("user-ub-beats-recipe", "rot-moe", "strix", {"extra": ("--ubatch-size", "256")}, "rocm", "ROCm0",
     ["--ubatch-size", "256"], {"GGML_W4A4_TENSORS": "all"}),
    ("user-ngl-beats-route", "dense", "strix", {"extra": ("-ngl", "10")}, "vulkan", "Vulkan0-no-ngl",
     ["-ngl", "10"], {}),
    ("user-p-min-beats-recipe", "dense", "strix", {"dflash": "draft16", "device": "rocm",
                                                    "extra": ("--draft-p-min", "0.1")}, "rocm", "ROCm0",
     ["--spec-type", "draft-dflash", "-md", "@draft16", "-ngld", "99", "--spec-draft-n-max", "15",
      "--draft-p-min", "0.1"], {}),
    ("host-port-exec", "dense", "strix", {"host": "0.0.0.0", "port": 9123, "allow_remote": True}, "vulkan",
     "Vulkan0", [], {}),
]


@pytest.mark.parametrize("case", EXEC_TABLE, ids=[c[0] for c in EXEC_TABLE])
def test_exec_table(models, bundles, case):
    _, model, bundle, flags, backend, dev, tail, env = case
    plan = run(models, bundles, model=model, bundle=bundle, **dict(flags))
    assert isinstance(plan, LaunchPlan), plan
    assert plan.mode == "exec" and plan.proxy is None and len(plan.children) == 1
    c = plan.children[0]
    assert c.backend == backend
    host = flags.get("host", "127.0.0.1")
    port = str(flags.get("port", 8080))
    if dev == "Vulkan0-no-ngl":  # the user's -ngl replaced ours
        want = [bin_of(bundles[bundle], backend), "-m", str(models[model]), "--host", host, "--port", port,
                "--device", "Vulkan0", "--jinja"]
    else:
        want = base(models, bundles, model, backend, dev, port=port, host=host, bundle=bundle)
    want += [str(models[t[1:]]) if t.startswith("@") else t for t in tail]
    assert list(c.argv) == want
    assert dict(c.env) == {k: (str(models[v[1:]]) if v.startswith("@") else v) for k, v in env.items()}


# --- refusals -------------------------------------------------------------------------------------------------------

REFUSALS = [
    ("rotated-on-vulkan", "rot", "strix", {"device": "vulkan"}, "hadamard-device", "only the lean ROCm build"),
    ("rotated-on-cpu", "rot", "strix", {"device": "cpu"}, "hadamard-device", "rotates the activations"),
    ("rotated-on-hrx", "rot", "strix", {"device": "hrx"}, "hadamard-device", "--device hrx"),
    ("rotated-on-cpu-bundle", "rot", "cpu", {}, "hadamard-device", "does not have"),
    ("rotated-rocm-without-feature", "rot", "rocm-nohad", {}, "hadamard-device", "hadamard_w4a4"),
    ("rotated-64-unsupported", "rot64", "strix", {}, "hadamard-block", "onebit.hadamard_q4_0=64"),
    ("mtp-with-dflash", "dense", "strix", {"mtp": "h.gguf", "dflash": "draft16"}, "mtp-dflash", "cannot be combined"),
    ("mtp-max-without-mtp", "dense", "strix", {"mtp_max": 4}, "mtp-options", "need --mtp"),
    ("moe-slots-on-rocm", "moe", "strix", {"moe_slots": 4, "device": "rocm"}, "moe-slots-device", "vulkan only"),
    ("moe-slots-on-cpu", "moe", "cpu", {"moe_slots": 4}, "moe-slots-device", "vulkan only"),
    ("moe-slots-dense", "dense", "strix", {"moe_slots": 4}, "moe-slots-dense", "needs an MoE model"),
    ("1bp-on-vulkan", "pkg", "strix", {"device": "vulkan"}, "1bp-device", "only the ds4 backend"),
    ("1bp-without-ds4", "pkg", "cpu", {}, "1bp-device", "no ds4 backend"),
    ("ds4-for-gguf", "dense", "strix", {"device": "ds4"}, "ds4-needs-1bp", "1BP packages only"),
    ("device-not-in-bundle", "dense", "cpu", {"device": "vulkan"}, "device-missing", "has: cpu"),
    ("unknown-device", "dense", "strix", {"device": "tpu"}, "device-unknown", "unknown device"),
    ("prefill-not-hrx", "dense", "strix", {"prefill_device": "rocm"}, "prefill-device", "only hrx"),
    ("prefill-on-rocm", "dense", "strix", {"prefill_device": "hrx", "device": "rocm"}, "prefill-device", "decodes on vulkan"),
    ("prefill-no-hrx", "dense", "vulkan-only", {"prefill_device": "hrx"}, "prefill-device", "needs the hrx backend"),
    ("prefill-hrx-without-vulkan0", "dense", "hrx-only-hrx0", {"prefill_device": "hrx"}, "prefill-device",
     "carries both HRX0 and Vulkan0; this bundle's hrx backend lists HRX0"),
    ("adaptive-needs-rocm", "dense", "vulkan-only", {"adaptive": True}, "adaptive-backends", "vulkan and rocm"),
    ("adaptive-with-device", "dense", "strix", {"adaptive": True, "device": "cpu"}, "adaptive-device", "drop --device"),
    ("adaptive-rotated", "rot", "strix", {"adaptive": True}, "hadamard-device", "only the lean ROCm build"),
    ("long-and-adaptive", "dense", "strix", {"adaptive": True, "long_model": "moe"}, "long-adaptive", "cannot be combined"),
    ("long-model-rotated-on-vulkan", "dense", "strix", {"long_model": "rot", "device": "vulkan"}, "hadamard-device",
     "rot.gguf is Hadamard-rotated"),
    ("dflash-drafter-1bp", "dense", "strix", {"dflash": "pkg"}, "dflash-1bp", "not a 1BP package"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_refusals(models, bundles, case):
    _, model, bundle, flags, rule, text = case
    r = run(models, bundles, model=model, bundle=bundle, **dict(flags))
    assert isinstance(r, Refusal), r
    assert r.rule == rule
    assert text in r.message
    assert "\n" not in r.message
    assert r.to_json() == {"ok": False, "refused": rule, "message": r.message}


# --- environment precedence and binary resolution -------------------------------------------------------------------


def test_user_env_wins_over_route_and_manifest(models, bundles):
    plan = run(models, bundles, model="rot-moe", env={"GGML_W4A4_TENSORS": "attn"})
    assert "GGML_W4A4_TENSORS" not in plan.children[0].env  # the user's value is inherited untouched
    plan = run(models, bundles, model="dense", bundle="with-env", env={"RADV_PERFTEST": "mine"})
    assert dict(plan.children[0].env) == {"GGML_VK_X": "1"}
    plan = run(models, bundles, model="dense", bundle="with-env")
    assert dict(plan.children[0].env) == {"RADV_PERFTEST": "sam", "GGML_VK_X": "1"}


def test_moe_slots_env_user_wins(models, bundles):
    plan = run(models, bundles, model="moe", moe_slots=2, env={"ONEBIT_MOE_SLOTS": "9"})
    assert dict(plan.children[0].env) == {"ONEBIT_MOE_FILE": str(models["moe"])}


@pytest.mark.parametrize(
    "flag,env,want",
    [
        ("/opt/flag/llama-server", {"ONEBIT_LLAMA_SERVER": "/e/ls"}, "/opt/flag/llama-server"),
        (None, {"ONEBIT_LLAMA_SERVER": "/e/ls"}, "/e/ls"),
        (None, {"ONEBIT_LLAMA_SERVER": "/e/ls", "ONEBIT_LLAMA_SERVER_VULKAN": "/e/vk"}, "/e/vk"),
        (None, {}, "MANIFEST"),
    ],
)
def test_binary_precedence(models, bundles, flag, env, want):
    plan = run(models, bundles, env=env, llama_server=flag)
    want = bin_of(bundles["strix"], "vulkan") if want == "MANIFEST" else want
    assert plan.children[0].binary == want == plan.children[0].argv[0]


def test_binary_from_path_then_refusal(models):
    facts = inspect_model(models["dense"])
    f = ServeFlags(model=str(models["dense"]), device="cpu")
    plan = route(facts, f, None, RouteEnv(path_llama_server="/usr/bin/llama-server"))
    assert plan.children[0].binary == "/usr/bin/llama-server"
    r = route(facts, f, None, RouteEnv())
    assert isinstance(r, Refusal) and r.rule == "no-binary"


# --- recipes -------------------------------------------------------------------------------------------------------


def test_shipped_recipes_are_the_measured_two():
    names = {r.name for r in RECIPES}
    assert names == {"rocm-dflash-p-min-0.4", "rotated-moe-ub1024"}
    assert all(r.measured for r in RECIPES)


def test_no_recipes_gives_bare_route(models, bundles):
    plan = run(models, bundles, model="rot-moe", recipes=())
    assert "-ub" not in plan.children[0].argv and plan.children[0].recipes == ()
    plan = run(models, bundles, model="rot-moe")
    assert plan.children[0].recipes == ("rotated-moe-ub1024",)


def test_recipe_matching_on_architecture_and_env(models, bundles):
    recipes = parse_recipes({"recipes": [
        {"name": "qwen-threads", "match": {"architecture": "qwen3", "moe": False}, "args": ["-t", "3"],
         "env": {"QWEN_X": "1"}, "measured": "test"},
    ]}, "test")
    facts = inspect_model(models["qwen"])
    f = ServeFlags(model=str(models["qwen"]), device="cpu")
    plan = route(facts, f, bundles["strix"], RouteEnv(), recipes)
    assert plan.children[0].argv[-2:] == ("-t", "3") and plan.children[0].env == {"QWEN_X": "1"}
    # a user-set env name and a user-given arg are left alone, so the recipe did nothing at all
    plan = route(facts, dataclasses.replace(f, extra=("--threads", "1")), bundles["strix"],
                 RouteEnv(env={"QWEN_X": "0"}), recipes)
    assert plan.children[0].argv[-2:] == ("--threads", "1") and plan.children[0].env == {}
    assert plan.children[0].recipes == ()
    # llama arch does not match
    plan = route(inspect_model(models["dense"]), dataclasses.replace(f, model=str(models["dense"])),
                 bundles["strix"], RouteEnv(), recipes)
    assert plan.children[0].recipes == ()


@pytest.mark.parametrize(
    "bad,msg",
    [
        ({"recipes": [{"name": "x", "args": ["-ub", "1"]}]}, 'missing "measured"'),
        ({"recipes": [{"name": "x", "match": {"gpu": "y"}, "measured": "m"}]}, "match keys"),
        ({"recipes": [{"name": "x", "args": ["1"], "measured": "m"}]}, "start with a flag"),
        ({"recipes": [{"name": "x", "measured": "m"}, {"name": "x", "measured": "m"}]}, "duplicate"),
        ({"nope": []}, '"recipes" list'),
    ],
)
def test_recipe_validation(bad, msg):
    from onebit.errors import RecipeError

    with pytest.raises(RecipeError, match=msg):
        parse_recipes(bad, "f.json")


# --- proxied routes -------------------------------------------------------------------------------------------------


def test_long_model_two_children(models, bundles):
    plan = run(models, bundles, model="dense", long_model="rot-moe", long_from=100, port=9000, alias="m")
    assert plan.mode == "proxy"
    assert plan.proxy.policy == "long" and plan.proxy.long_from == 100 and plan.proxy.port == 9000
    assert plan.proxy.alias == "m"
    d, lg = plan.children
    assert (d.role, d.backend, d.port, d.host) == ("default", "vulkan", 41001, "127.0.0.1")
    assert (lg.role, lg.backend, lg.port) == ("long", "rocm", 41002)
    assert lg.argv[1:3] == ("-m", str(models["rot-moe"])) and "-ub" in lg.argv
    assert lg.env == {"GGML_W4A4_TENSORS": "all"} and d.env == {}


def test_long_model_alias_defaults_to_stem(models, bundles):
    plan = run(models, bundles, bundle="cpu", model="dense", long_model="moe")
    assert plan.proxy.alias == "dense"
    for c in plan.children:
        i = c.argv.index("--alias")
        assert c.argv[i + 1] == "dense"


def test_adaptive(models, bundles):
    plan = run(models, bundles, model="moe", adaptive=True, adaptive_at=5)
    assert plan.mode == "proxy" and plan.proxy.policy == "adaptive" and plan.proxy.adaptive_at == 5
    v, r = plan.children
    assert (v.role, v.backend, v.slots) == ("vulkan", "vulkan", 5)
    assert v.argv[v.argv.index("-np") + 1] == "5"
    assert (r.role, r.backend, r.slots) == ("rocm", "rocm", None)
    assert "--device" in r.argv and r.argv[r.argv.index("--device") + 1] == "ROCm0"


def test_plan_json_roundtrip(models, bundles):
    import json

    plan = run(models, bundles, model="dense", long_model="moe")
    d = json.loads(json.dumps(plan.to_json()))
    assert d["ok"] is True and d["mode"] == "proxy" and len(d["children"]) == 2
    assert d["children"][0]["argv"][0] == bin_of(bundles["strix"], "vulkan")
    assert d["model"]["arch"] == "llama"


def test_split_options():
    assert split_options(["-ub", "1", "--flag", "--x=3", "-t", "-1"]) == [
        ("--ubatch-size", ["-ub", "1"]), ("--flag", ["--flag"]), ("--x", ["--x=3"]), ("--threads", ["-t", "-1"])]


# --- which binary each device runs (per-backend layout: libexec/onebit/<variant>/bin/llama-server) ------------------

# (id, bundle, flags, backend, binary relative to the prefix, --device given to it)
BINARY_TABLE = [
    ("vulkan", "strix", {"device": "vulkan"}, "vulkan", "libexec/onebit/vulkan/bin/llama-server", "Vulkan0"),
    ("auto-is-vulkan", "strix", {}, "vulkan", "libexec/onebit/vulkan/bin/llama-server", "Vulkan0"),
    ("hrx", "strix", {"device": "hrx"}, "hrx", "libexec/onebit/hrx/bin/llama-server", "HRX0"),
    ("prefill-split", "strix", {"prefill_device": "hrx"}, "hrx", "libexec/onebit/hrx/bin/llama-server", "Vulkan0"),
    ("cpu", "strix", {"device": "cpu"}, "cpu", "libexec/onebit/cpu/bin/llama-server", None),
    ("cuda", "nvidia", {"device": "cuda"}, "cuda", "libexec/onebit/cuda/bin/llama-server", "CUDA0"),
    ("rocm", "strix", {"device": "rocm"}, "rocm", "libexec/onebit/lean-rocm/bin/llama-server", "ROCm0"),
    ("lean-vulkan", "lean", {"device": "vulkan"}, "lean-vulkan", "libexec/onebit/lean-vulkan/bin/llama-server",
     "Vulkan0"),
]


@pytest.mark.parametrize("case", BINARY_TABLE, ids=[c[0] for c in BINARY_TABLE])
def test_binary_per_device(models, bundles, case):
    _, bundle, flags, backend, rel, dev = case
    plan = run(models, bundles, bundle=bundle, **flags)
    assert isinstance(plan, LaunchPlan), plan
    c = plan.children[0]
    m = bundles[bundle]
    assert (c.backend, c.binary, c.argv[0], c.adapter) == (backend, str(m.prefix / rel), str(m.prefix / rel),
                                                            "llama-server")
    argv = list(c.argv)
    assert (argv[argv.index("--device") + 1] if "--device" in argv else None) == dev


def test_every_strix_backend_runs_its_own_binary(models, bundles):
    seen = {}
    for dev in ("vulkan", "hrx", "rocm", "cpu"):
        seen[dev] = run(models, bundles, device=dev).children[0].binary
    assert len(set(seen.values())) == len(seen), seen


# --- which bundle holds what (onebit/data/bundles.json), checked against the bundle and recipe files ------------------

REPO = Path(__file__).resolve().parent.parent


def test_bundles_data_matches_the_bundle_and_recipe_files():
    """The serve side's copy of "which bundle holds which backend" is what bundles/*.yaml and recipes/*.yaml build."""
    from builders.project.config import load_project

    project = load_project(REPO)
    assert set(BUNDLES) == set(project.bundles)
    for name, bundle in project.bundles.items():
        want = {v.backend: (v.adapter, sorted(v.binaries)) for v in project.variants(bundle) if v.backend}
        got = {b: (adapter, sorted(programs)) for b, (adapter, programs) in BUNDLES[name].backends.items()}
        assert got == want, name
        assert BUNDLES[name].package == f"onebit-bundle-{name}"


def test_manifest_schema_accepts_every_backend_a_bundle_builds():
    from onebit.manifest import schema

    names = set(schema()["properties"]["backends"]["propertyNames"]["enum"])
    assert {b for info in BUNDLES.values() for b in info.backends} <= names


def test_ds4_variants_serve_1bp_packages(models):
    """The ds4 recipe's variants provide ds4-rocm and ds4-cpu (strix holds both): a 1BP package goes to the GPU one."""
    facts = inspect_model(models["pkg"])
    for held, want, backend_flag in ((("ds4-rocm", "ds4-cpu", "cpu"), "ds4-rocm", "cuda"),  # HIP is ds4's cuda backend (onebit/adapters.py)
                                     (("ds4-cpu", "cpu"), "ds4-cpu", "cpu")):
        m = Manifest(path=Path("/p/share/onebit/manifest.json"), prefix=Path("/p"), bundle="strix", version="1",
                     build_number=0, platform="linux-64",
                     backends={b: Backend(name=b, binaries={"ds4-server": f"libexec/onebit/{b}/bin/ds4-server"}
                                          if b.startswith("ds4") else {"llama-server": "x/llama-server"},
                                          devices=("ROCm0",) if b == "ds4-rocm" else ("CPU",),
                                          adapter="ds4" if b.startswith("ds4") else "llama-server")
                               for b in held})
        plan = route(facts, ServeFlags(model=facts.path), m, RouteEnv())
        assert isinstance(plan, LaunchPlan), plan
        (c,) = plan.children
        assert (c.backend, c.adapter, c.argv[0]) == (want, "ds4", f"/p/libexec/onebit/{want}/bin/ds4-server")
        assert c.argv[c.argv.index("--backend") + 1] == backend_flag


# --- the engine's Lemonade backend (1bit-MONSTER/lemonade, src/cpp/server/backends/onebit/onebit_server.cpp) -----------
# OnebitServer::load runs `1bit serve -m M --port P --device D --alias NAME [--ctx-size N] [--embedding|--reranking]`
# (+ the onebit_args option, split on spaces); D is its onebit_backend option (auto, hrx, npu; `cuda` is sent as zinc).
# Every form on every bundle: a launch plan, or one line that says what to install.

LEMONADE_DEVICES = ("auto", "hrx", "npu", "zinc")
LEMONADE_MODES = ((), ("--embedding",), ("--reranking",))


def _lemonade_argv(model, device, mode, ctx, extra=()):
    argv = ["-m", str(model), "--port", "8765", "--device", device, "--alias", "Qwen3-0.6B-GGUF"]
    return argv + (["--ctx-size", str(ctx)] if ctx else []) + list(mode) + list(extra)


@pytest.fixture(scope="module")
def shipped_bundles(tmp_path_factory):
    """A manifest per bundle of onebit/data/bundles.json (the backends its recipes build), per-backend layout."""
    from onebit.manifest import schema

    accepted = set(schema()["properties"]["backends"]["propertyNames"]["enum"])
    out = {}
    for name, info in BUNDLES.items():
        p = tmp_path_factory.mktemp(f"shipped-{name}")
        out[name] = write_manifest(p, [b for b in info.backends if b in accepted], bundle=name, layout="per-backend")
    return out


def _serve_plan(shipped_bundles, bundle, argv):
    from onebit.cli import plan_from_args

    env = {"ONEBIT_MANIFEST": str(shipped_bundles[bundle]), "PATH": ""}
    plan, _ = plan_from_args(argv, env)
    return plan


STRIX_INSTALL = "is in the strix bundle: install onebit-bundle-strix"
NO_NPU_PROGRAM = ("no bundle serves it yet: the strix bundle's npu backend ships amdxdna.ko, "
                  "not npu-server")
# (device, bundle) -> ("exec", backend, the --device llama-server gets) | ("refused", rule, the message)
LEMONADE_TABLE = {
    ("auto", "cpu"): ("exec", "cpu", None),
    ("auto", "vulkan"): ("exec", "vulkan", "Vulkan0"),
    ("auto", "nvidia"): ("exec", "cuda", "CUDA0"),
    ("auto", "strix"): ("exec", "vulkan", "Vulkan0"),
    ("hrx", "cpu"): ("refused", "device-missing", f"--device hrx: this bundle (cpu) has no hrx backend (has: cpu); "
                     f"hrx {STRIX_INSTALL}"),
    ("hrx", "vulkan"): ("refused", "device-missing", "--device hrx: this bundle (vulkan) has no hrx backend "
                        f"(has: cpu, vulkan); hrx {STRIX_INSTALL}"),
    ("hrx", "nvidia"): ("refused", "device-missing", "--device hrx: this bundle (nvidia) has no hrx backend "
                        f"(has: cpu, cuda); hrx {STRIX_INSTALL}"),
    ("hrx", "strix"): ("exec", "hrx", "HRX0"),
    ("npu", "cpu"): ("refused", "device-missing", f"--device npu: this bundle (cpu) has no npu backend (has: cpu); "
                     f"{NO_NPU_PROGRAM}"),
    ("npu", "vulkan"): ("refused", "device-missing", "--device npu: this bundle (vulkan) has no npu backend "
                        f"(has: cpu, vulkan); {NO_NPU_PROGRAM}"),
    ("npu", "nvidia"): ("refused", "device-missing", "--device npu: this bundle (nvidia) has no npu backend "
                        f"(has: cpu, cuda); {NO_NPU_PROGRAM}"),
    ("npu", "strix"): ("refused", "no-program", "the npu backend of this bundle lists no npu-server program for its "
                       "npu adapter (it ships: amdxdna.ko); nothing to launch for --device npu"),
    ("zinc", "cpu"): ("refused", "device-missing", f"--device zinc: this bundle (cpu) has no zinc backend (has: cpu); "
                      f"zinc {STRIX_INSTALL}"),
    ("zinc", "vulkan"): ("refused", "device-missing", "--device zinc: this bundle (vulkan) has no zinc backend "
                         f"(has: cpu, vulkan); zinc {STRIX_INSTALL}"),
    # Lemonade sends zinc for NVIDIA; the nvidia bundle ships no zinc (on the H200 llama.cpp's CUDA build decoded 1.8x
    # zinc's rate, and zinc needs a Vulkan loader a driver-only NVIDIA host lacks): cuda stands in, with a note
    ("zinc", "nvidia"): ("exec", "cuda", "CUDA0"),
    # zinc listens on every interface (no --host): it needs --allow-remote, like any remote bind (see below)
    ("zinc", "strix"): ("refused", "remote-bind", "--device zinc: zinc has no --host option and listens on 0.0.0.0:"),
}


def test_lemonade_table_covers_every_form_and_bundle():
    assert set(LEMONADE_TABLE) == {(d, b) for d in LEMONADE_DEVICES for b in BUNDLES}


@pytest.mark.parametrize("mode", LEMONADE_MODES, ids=lambda m: m[0] if m else "chat")
@pytest.mark.parametrize("ctx", [None, 4096], ids=["no-ctx", "ctx"])
@pytest.mark.parametrize("device,bundle", sorted(LEMONADE_TABLE), ids=lambda x: x)
def test_lemonade_forms(models, shipped_bundles, device, bundle, ctx, mode):
    want = LEMONADE_TABLE[(device, bundle)]
    plan = _serve_plan(shipped_bundles, bundle, _lemonade_argv(models["dense"], device, mode, ctx))
    if want[0] == "refused":
        assert isinstance(plan, Refusal), plan
        if device == "zinc" and bundle == "strix" and mode:  # zinc serves chat only: that is said first
            assert plan.rule == "adapter-option" and plan.message == (
                f"{mode[0]}: zinc (the zinc backend) serves chat only; an embedding or reranking model needs a "
                "llama-server backend (--device auto)")
            return
        assert plan.rule == want[1] and "\n" not in plan.message
        assert plan.message.startswith(want[2]), plan.message
        if want[1] == "device-missing" and device != "npu":
            assert plan.message.endswith("install onebit-bundle-strix")
        return
    assert isinstance(plan, LaunchPlan), plan
    _, backend, dev = want
    (c,) = plan.children
    argv = list(c.argv)
    assert (plan.mode, c.backend, c.adapter) == ("exec", backend, "llama-server")
    assert argv[argv.index("--port") + 1] == "8765" and argv[argv.index("--alias") + 1] == "Qwen3-0.6B-GGUF"
    assert (argv[argv.index("--device") + 1] if "--device" in argv else None) == dev
    assert (argv[argv.index("-c") + 1] if "-c" in argv else None) == (str(ctx) if ctx else None)
    assert [a for a in argv if a in ("--embedding", "--reranking")] == list(mode)
    if device == "zinc":  # a stand-in is said, not silent
        assert c.notes == ("zinc is not in this bundle: CUDA0 serves the NVIDIA GPU through the cuda backend",)
    else:
        assert c.notes == ()


def test_lemonade_zinc_with_allow_remote_runs_behind_the_proxy(models, shipped_bundles):
    """With --allow-remote (Lemonade's onebit_args), --device zinc --alias runs: zinc has no alias and loads the model a
    request names, so the proxy answers under the alias on the public port and drops "model" before zinc."""
    plan = _serve_plan(shipped_bundles, "strix",
                       _lemonade_argv(models["dense"], "zinc", (), 4096, extra=("--allow-remote",)))
    assert isinstance(plan, LaunchPlan), plan
    (c,) = plan.children
    assert plan.mode == "proxy" and plan.proxy.policy == "single"
    assert (plan.proxy.host, plan.proxy.port, plan.proxy.alias) == ("127.0.0.1", 8765, "Qwen3-0.6B-GGUF")
    assert (c.adapter, c.host, c.bind, c.drop_model) == ("zinc", "127.0.0.1", "0.0.0.0", True)
    assert list(c.argv[1:]) == ["-m", str(models["dense"]), "-p", str(c.port), "-d", "0", "-c", "4096"]
    assert c.port != 8765


# --- listening beyond loopback needs --allow-remote, whatever program listens ------------------------------------------

# (id, bundle, flags, refused?) for the pure route (the CLI also refuses --host strings before reading any file)
REMOTE_TABLE = [
    ("loopback-exec", "strix", {}, False),
    ("lan-host-exec", "strix", {"host": "192.0.2.7"}, True),
    ("lan-host-allowed", "strix", {"host": "192.0.2.7", "allow_remote": True}, False),
    ("host-in-extra", "strix", {"extra": ("--host", "0.0.0.0")}, True),
    ("zinc-loopback-host", "strix", {"device": "zinc"}, True),  # zinc binds 0.0.0.0 whatever --host says
    ("zinc-alias-proxy", "strix", {"device": "zinc", "alias": "a"}, True),  # behind the proxy, still 0.0.0.0
    ("zinc-allowed", "strix", {"device": "zinc", "allow_remote": True}, False),
    ("proxy-public-host", "strix", {"long_model": "moe", "host": "0.0.0.0"}, True),
    ("proxy-loopback", "strix", {"long_model": "moe"}, False),
]


@pytest.mark.parametrize("case", REMOTE_TABLE, ids=[c[0] for c in REMOTE_TABLE])
def test_remote_binds_need_allow_remote(models, bundles, case):
    _, bundle, flags, refused = case
    plan = run(models, bundles, bundle=bundle, **dict(flags))
    if refused:
        assert isinstance(plan, Refusal) and plan.rule == "remote-bind", plan
        assert "--allow-remote" in plan.message and "\n" not in plan.message
    else:
        assert isinstance(plan, LaunchPlan), plan
        assert all(c.bind for c in plan.children)
