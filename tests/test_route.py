"""Tables over the pure route function, with model files written by the gguf library."""

from __future__ import annotations

import dataclasses

import pytest
from serve_fixtures import STRIX, models, per_backend_layout, write_manifest  # noqa: F401  (models is a fixture)

from onebit.inspect import inspect_model
from onebit.manifest import load_manifest
from onebit.recipes import default_recipes_path, load_recipes, parse_recipes
from onebit.route import LaunchPlan, Refusal, RouteEnv, ServeFlags, route, split_options

RECIPES = load_recipes(default_recipes_path())


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    def make(name, backends, **kw):
        p = tmp_path_factory.mktemp(name)
        return load_manifest(write_manifest(p, backends, bundle=name, layout="per-backend", **kw))

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
    ("host-port-exec", "dense", "strix", {"host": "0.0.0.0", "port": 9123}, "vulkan", "Vulkan0", [], {}),
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
