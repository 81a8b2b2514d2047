"""Laya routing: size gate, confidence floor, policy, per-conversation cache, header, refusals, the CLI and the proxy."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web
from laya_fake import FakeClassifier
from load_client import healthy
from serve_fixtures import STRIX, free_port, models, start_app, write_manifest  # noqa: F401  (models is a fixture)
from tiny_gguf import write_tiny_gguf

from onebit import cli
from onebit.inspect import inspect_model
from onebit.laya import (
    ALL_CLASSES,
    LONG_DOC_CHARS,
    LayaClassifier,
    LayaError,
    Router,
    conversation_key,
    decide,
    default_policy_path,
    gate,
    load_policy,
    opening,
    parse_policy,
    pinned_files,
    state_of,
    verify_checkpoint,
)
from onebit.manifest import load_manifest
from onebit.proxy import Proxy, Upstream, serve_forever
from onebit.devices import DEVICES
from onebit.launch_plan import LaunchPlan, Refusal
from onebit.route import route
from onebit.serve_flags import RouteEnv, ServeFlags

HERE = Path(__file__).resolve().parent
DEVS = DEVICES[1:]
SHIPPED = load_policy(None, DEVS)


def policy(**classes):
    data = {"schema_version": 1, "min_confidence": 0.16, "default": "vulkan",
            "classes": {c: {"device": "vulkan"} for c in ALL_CLASSES}}
    for c, v in classes.items():
        data["classes"][c] = v if isinstance(v, dict) else {"device": v}
    return parse_policy(data, "test-policy.json", DEVS)


TEST_POLICY = policy(code="hrx", prose="zinc", short="cpu", long_doc="rocm")
ROLES = {c: r.device for c, r in TEST_POLICY.classes.items()}


# --- the shipped policy and pins -----------------------------------------------------------------------------------


def test_shipped_policy_sends_every_class_to_vulkan():
    assert SHIPPED.min_confidence == 0.16 and SHIPPED.default == "vulkan"
    assert {c: (r.device, r.drafter) for c, r in SHIPPED.classes.items()} == {c: ("vulkan", None) for c in ALL_CLASSES}
    assert default_policy_path().name == "laya-policy.json"


def test_shipped_checkpoint_hashes_are_the_pins():
    pins = yaml.safe_load((HERE.parent / "pins.yaml").read_text())["pins"]["laya"]["companions"]["huggingface"]
    shipped = json.loads((HERE.parent / "onebit" / "data" / "laya-checkpoint.json").read_text())
    assert shipped["files"] == pins["files"] == pinned_files()
    assert shipped["revision"] == pins["revision"] and shipped["repo"] == pins["repo"]


@pytest.mark.parametrize(
    "mutate,msg",
    [
        (lambda d: d.update(min_confidence=2), "min_confidence must be a number between 0 and 1"),
        (lambda d: d.update(default="tpu"), "default 'tpu' is not a serve device"),
        (lambda d: d["classes"].pop("long_doc"), "classes must name exactly code, prose, short, long_doc"),
        (lambda d: d["classes"]["code"].update(device="gpu9"), "classes.code.device 'gpu9' is not a serve device"),
        (lambda d: d["classes"]["code"].update(drafter="eagle"), "classes.code.drafter must be one of dflash, mtp"),
        (lambda d: d.update(extra=1), "unknown key 'extra'"),
        (lambda d: d.update(schema_version=2), "schema_version must be 1"),
    ],
)
def test_policy_validation(mutate, msg):
    data = json.loads(default_policy_path().read_text())
    mutate(data)
    with pytest.raises(LayaError) as e:
        parse_policy(data, "p.json", DEVS)
    assert str(e.value).startswith("p.json: ") and msg in str(e.value)


def test_policy_file_errors(tmp_path):
    with pytest.raises(LayaError, match="no Laya policy at"):
        load_policy(tmp_path / "none.json", DEVS)
    (tmp_path / "bad.json").write_text("{\n  oops")
    with pytest.raises(LayaError, match=r"bad.json:2: Laya policy is not valid JSON"):
        load_policy(tmp_path / "bad.json", DEVS)


# --- the pure rules --------------------------------------------------------------------------------------------------

# (id, state, classifier's fixed answer or None when it must not be asked, class, confidence, device)
DECIDE = [
    ("size-gate-at-1024", "x" * LONG_DOC_CHARS, None, "long_doc", 1.0, "rocm"),
    ("size-gate-long", "y" * 5000, None, "long_doc", 1.0, "rocm"),
    ("below-gate-asks", "x" * (LONG_DOC_CHARS - 1), ("short", 0.9), "short", 0.9, "cpu"),
    ("code", "write a rust function", ("code", 0.44), "code", 0.44, "hrx"),
    ("prose", "an essay please", ("prose", 0.31), "prose", 0.31, "zinc"),
    ("floor-exact", "q", ("code", 0.16), "code", 0.16, "hrx"),
    ("below-floor-default", "q", ("code", 0.159), "code", 0.159, "vulkan"),
    ("zero-confidence-default", "q", ("prose", 0.0), "prose", 0.0, "vulkan"),
]


class Fixed:
    def __init__(self, answer):
        self.answer, self.asked = answer, []

    def classify(self, state):
        self.asked.append(state)
        if self.answer is None:
            raise AssertionError("the size gate must decide without the classifier")
        return self.answer


@pytest.mark.parametrize("case", DECIDE, ids=[c[0] for c in DECIDE])
def test_decide(case):
    _, state, answer, cls, conf, device = case
    c = Fixed(answer)
    d = decide(state, c, TEST_POLICY, ROLES, "vulkan")
    assert (d.cls, d.confidence, d.device) == (cls, conf, device)
    assert len(c.asked) == (0 if answer is None else 1)
    assert gate(state) is (answer is None)


def test_header_format():
    d = decide("write a rust function", FakeClassifier(), SHIPPED, {c: "vulkan" for c in ALL_CLASSES}, "vulkan")
    assert d.header() == "code 0.44 vulkan"
    assert decide("z" * 2000, FakeClassifier(), SHIPPED, {c: "vulkan" for c in ALL_CLASSES}, "vulkan").header() == \
        "long_doc 1.00 vulkan"


def test_classifier_answer_outside_the_classes_is_refused():
    with pytest.raises(LayaError, match="answered 'long_doc', not one of code, prose, short"):
        decide("q", Fixed(("long_doc", 0.9)), SHIPPED, ROLES, "vulkan")


def test_opening_is_the_messages_up_to_the_first_user_message():
    first = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}
    later = {"messages": first["messages"] + [{"role": "assistant", "content": "hello"},
                                              {"role": "user", "content": "write an essay"}]}
    other_system = {"messages": [{"role": "system", "content": "be long"}, {"role": "user", "content": "hi"}]}
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"},
                                                        {"type": "text", "text": "b"}]}]}
    assert opening(first) == opening(later) == [("system", "be brief"), ("user", "hi")]
    assert conversation_key(opening(first)) == conversation_key(opening(later))
    assert conversation_key(opening(first)) != conversation_key(opening(other_system))
    assert state_of(opening(first)) == "be brief\nhi"
    assert state_of(opening(parts)) == "a\nb"
    assert opening({"prompt": "p"}) == [("prompt", "p")]
    assert opening({"input": "x"}) is None


def test_router_decides_once_per_conversation_and_logs_each_decision():
    fake, lines = FakeClassifier(), []
    r = Router(fake, TEST_POLICY, ROLES, "vulkan", log=lines.append)
    conv = [{"role": "user", "content": "fix this python bug"}]
    d1 = r.decide_sync({"messages": conv})
    d2 = r.decide_sync({"messages": conv + [{"role": "assistant", "content": "ok"},
                                            {"role": "user", "content": "now write a story"}]})
    d3 = r.decide_sync({"messages": [{"role": "user", "content": "write a story"}]})
    assert (d1, d1.header()) == (d2, "code 0.44 hrx")
    assert d3.header() == "prose 0.31 zinc"
    assert fake.asked == ["fix this python bug", "write a story"]
    assert lines == ["1bit serve: laya: code 0.44 hrx", "1bit serve: laya: prose 0.31 zinc"]


# --- the real classifier's checks (hashes, package, call shape) -------------------------------------------------------


def _checkpoint(tmp_path):
    d = tmp_path / "ckpt"
    files = {}
    for rel, content in {"model.safetensors": b"weights", "encoder/config.json": b"{}"}.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(content)
        files[rel] = hashlib.sha256(content).hexdigest()
    return d, files


def test_verify_checkpoint(tmp_path):
    d, files = _checkpoint(tmp_path)
    verify_checkpoint(d, files)
    with pytest.raises(LayaError, match=r"no Laya checkpoint at .*missing: install the bundle's laya package"):
        verify_checkpoint(tmp_path / "missing", files)
    with pytest.raises(LayaError, match=r"lacks rl_agent_config.json \(pinned in pins.yaml laya.companions\)"):
        verify_checkpoint(d, {**files, "rl_agent_config.json": "0" * 64})
    (d / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(LayaError, match=r"model.safetensors: sha256 .* is not the pinned"):
        verify_checkpoint(d, files)


def test_laya_classifier_loads_the_verified_checkpoint_through_the_laya_package(tmp_path):
    d, files = _checkpoint(tmp_path)
    sys.modules.pop("laya", None)
    c = LayaClassifier(d, files=files, python_path=HERE / "fake_laya")
    import laya  # the fake package, from python_path

    assert c.classify("write a rust function") == ("code", 0.44)
    assert laya.FAKE_CALLS[0] == ("load", str(d), "cpu")
    (_, state, questions), = laya.FAKE_CALLS[1:]
    assert state == {"body": "write a rust function"}
    assert questions["request_class"]["type"] == "choice"
    assert sorted(questions["request_class"]["criteria"]) == ["code", "prose", "short"]
    sys.modules.pop("laya", None)


def test_laya_classifier_without_the_package_is_one_line(tmp_path, monkeypatch):
    d, files = _checkpoint(tmp_path)
    monkeypatch.setitem(sys.modules, "laya", None)  # import laya -> ImportError
    with pytest.raises(LayaError, match="the laya package cannot be imported"):
        LayaClassifier(d, files=files)


# --- route: the Laya plan and its refusals --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def strix(tmp_path_factory):
    return load_manifest(write_manifest(tmp_path_factory.mktemp("strix"), STRIX, layout="per-backend"))


def laya_plan(models, manifest, pol=SHIPPED, model="dense", **flags):
    facts = inspect_model(models[model])
    f = ServeFlags(model=str(models[model]), laya=True, laya_model="/ckpt", **flags)
    return route(facts, f, manifest, RouteEnv(free_ports=(41001, 41002, 41003, 41004, 41005)), laya_policy=pol)


def test_shipped_policy_plan_is_one_vulkan_child_behind_the_laya_proxy(models, strix):
    p = laya_plan(models, strix)
    assert isinstance(p, LaunchPlan), p
    assert p.mode == "proxy" and p.proxy.policy == "laya"
    assert [(c.role, c.backend, c.port) for c in p.children] == [("vulkan", "vulkan", 41001)]
    assert p.proxy.laya.classes == {c: "vulkan" for c in ALL_CLASSES} and p.proxy.laya.default == "vulkan"
    assert p.proxy.laya.model_dir == "/ckpt" and p.proxy.laya.min_confidence == 0.16
    assert "--alias" in p.children[0].argv and p.children[0].host == "127.0.0.1"
    json.dumps(p.to_json())


def test_policy_devices_become_children_and_missing_ones_fall_back(models, strix, tmp_path):
    # the policy sends prose to zinc, which listens on every interface: that needs --allow-remote, like any remote bind
    r = laya_plan(models, strix, TEST_POLICY)
    assert isinstance(r, Refusal) and r.rule == "remote-bind" and r.message.startswith("--device zinc: zinc has no")
    p = laya_plan(models, strix, TEST_POLICY, allow_remote=True)
    assert [(c.role, c.backend, c.adapter) for c in p.children] == [
        ("vulkan", "vulkan", "llama-server"), ("hrx", "hrx", "llama-server"), ("zinc", "zinc", "zinc"),
        ("cpu", "cpu", "llama-server"), ("rocm", "rocm", "llama-server")]
    assert p.proxy.laya.classes == {"code": "hrx", "prose": "zinc", "short": "cpu", "long_doc": "rocm"}
    cpu_only = load_manifest(write_manifest(tmp_path / "c", ["cpu", "vulkan"], layout="per-backend"))
    p = laya_plan(models, cpu_only, TEST_POLICY)
    assert [c.role for c in p.children] == ["vulkan", "cpu"]
    assert p.proxy.laya.classes == {"code": "vulkan", "prose": "vulkan", "short": "cpu", "long_doc": "vulkan"}


def test_device_flag_replaces_the_policy_default(models, strix):
    p = laya_plan(models, strix, TEST_POLICY, device="cpu", allow_remote=True)  # zinc: see above
    assert p.proxy.laya.default == "cpu" and p.children[0].role == "cpu"


def test_per_class_drafter(models, strix):
    pol = policy(short={"device": "vulkan", "drafter": "mtp"})
    p = laya_plan(models, strix, pol, mtp="head.gguf")
    assert [c.role for c in p.children] == ["vulkan", "vulkan+mtp"]
    assert p.proxy.laya.classes["short"] == "vulkan+mtp"
    assert "draft-mtp" in p.children[1].argv
    r = laya_plan(models, strix, pol)
    assert isinstance(r, Refusal) and r.rule == "laya-drafter" and "pass --mtp HEAD" in r.message


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("bert") / "bert.gguf", arch="bert")


# (id, flags, rule, text)
LAYA_REFUSALS = [
    ("adaptive", {"adaptive": True}, "laya-adaptive", "--laya and --adaptive cannot be combined"),
    ("prefill", {"prefill_device": "hrx"}, "laya-prefill", "--laya and --prefill-device hrx cannot be combined"),
    ("long-model", {"long_model": "x.gguf"}, "laya-long-model", "--laya and --long-model cannot be combined"),
    ("embedding-flag", {"extra": ("--embedding",)}, "laya-embedding", "embedding server (--embedding)"),
    ("pooling-flag", {"extra": ("--pooling=cls",)}, "laya-embedding", "embedding server (--pooling)"),
    ("default-not-in-bundle", {"device": "cuda"}, "laya-device", "the Laya default device cuda is not in this bundle"),
]


@pytest.mark.parametrize("case", LAYA_REFUSALS, ids=[c[0] for c in LAYA_REFUSALS])
def test_laya_refusals(models, strix, case):
    _, flags, rule, text = case
    r = laya_plan(models, strix, **flags)
    assert isinstance(r, Refusal), r
    assert r.rule == rule and text in r.message and "\n" not in r.message


def test_laya_refuses_an_embedding_model(models, strix, bert):
    r = laya_plan(dict(models, bert=bert), strix, model="bert")
    assert isinstance(r, Refusal) and r.rule == "laya-embedding"
    assert r.message == "--laya cannot route bert.gguf: it is an embedding model (bert)"


# --- `1bit route --classify` ------------------------------------------------------------------------------------------


def test_route_classify_prints_class_confidence_device(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr("onebit.laya.LayaClassifier", lambda model_dir, python_path=None: FakeClassifier())
    rc = cli.main(["route", "--laya-model", str(tmp_path), "--classify", "--state",
                   "Write a Rust function that sums a slice."])
    assert (rc, capsys.readouterr().out) == (0, "code 0.44 vulkan\n")


def test_route_classify_without_a_checkpoint_is_one_line(capsys, tmp_path):
    rc = cli.main(["route", "--laya-model", str(tmp_path / "none"), "--classify", "--state", "hello"])
    out = capsys.readouterr()
    assert rc == 2 and out.out == ""
    assert out.err.count("\n") == 1 and out.err.startswith("1bit route: error: no Laya checkpoint at ")


def test_route_classify_long_document_needs_no_checkpoint(capsys, tmp_path):
    rc = cli.main(["route", "--laya-model", str(tmp_path / "none"), "--classify", "--state", "w " * 600])
    assert (rc, capsys.readouterr().out) == (0, "long_doc 1.00 vulkan\n")


# --- the proxy: header on every reply, one decision per conversation --------------------------------------------------


async def _upstream(name: str):
    async def health(request):
        return web.json_response({"status": "ok"})

    async def chat(request):
        body = await request.json()
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(f"data: {json.dumps({'from': name})}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        return web.json_response({"from": name})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", chat)
    async def models_(request):
        return web.json_response({"from": name})

    app.router.add_get("/v1/models", models_)
    return await start_app(app)


def test_proxy_routes_by_class_with_the_route_header():
    fake, lines = FakeClassifier(), []

    async def main():
        ups = [await _upstream(n) for n in ("vulkan", "hrx", "zinc")]
        roles = {"code": "hrx", "prose": "zinc", "short": "vulkan", "long_doc": "vulkan"}
        router = Router(fake, TEST_POLICY, roles, "vulkan", log=lines.append)
        proxy = Proxy([Upstream(n, u) for n, (_, u) in zip(("vulkan", "hrx", "zinc"), ups)], policy="laya",
                      alias="m", health_interval=0.02, laya=router)
        stop, port = asyncio.Event(), free_port()
        task = asyncio.create_task(serve_forever(proxy, "127.0.0.1", port, stop))
        url = f"http://127.0.0.1:{port}"
        out = []
        async with aiohttp.ClientSession() as s:
            await healthy(s, url)

            async def ask(messages, stream=False):
                async with s.post(url + "/v1/chat/completions",
                                  json={"model": "x", "messages": messages, "stream": stream}) as r:
                    text = await r.text()
                    return r.headers.get("X-1bit-Route"), text

            code = [{"role": "user", "content": "write a rust function"}]
            out.append(await ask(code))
            out.append(await ask(code + [{"role": "assistant", "content": "fn"},
                                         {"role": "user", "content": "now an essay"}], stream=True))
            out.append(await ask([{"role": "user", "content": "an essay about rivers"}]))
            out.append(await ask([{"role": "user", "content": "hello conf=0.05"}]))
            out.append(await ask([{"role": "user", "content": "p" * 1500}]))
            async with s.get(url + "/v1/models") as r:
                out.append((r.headers.get("X-1bit-Route"), await r.text()))
        stop.set()
        await task
        for runner, _ in ups:
            await runner.cleanup()
        return out

    out = asyncio.run(main())
    assert [h for h, _ in out] == ["code 0.44 hrx", "code 0.44 hrx", "prose 0.31 zinc", "short 0.05 vulkan",
                                   "long_doc 1.00 vulkan", "vulkan"]
    assert [json.loads(t.split("data: ")[1].split("\n")[0])["from"] if t.startswith("data:") else json.loads(t)["from"]
            for _, t in out] == ["hrx", "hrx", "zinc", "vulkan", "vulkan", "vulkan"]
    assert fake.asked == ["write a rust function", "an essay about rivers", "hello conf=0.05"]
    assert lines == ["1bit serve: laya: code 0.44 hrx", "1bit serve: laya: prose 0.31 zinc",
                     "1bit serve: laya: short 0.05 vulkan", "1bit serve: laya: long_doc 1.00 vulkan"]


# --- `1bit serve --laya` from the command line ------------------------------------------------------------------------


def _serve(prefix, *args, env=None):
    import os
    import subprocess

    e = {k: v for k, v in os.environ.items() if not k.startswith("ONEBIT_")}
    e.update(PYTHONPATH=str(HERE.parent), **(env or {}))
    return subprocess.run([sys.executable, "-m", "onebit.cli", "serve", *args, "--manifest",
                           str(prefix / "share/onebit/manifest.json")], env=e, capture_output=True, text=True,
                          timeout=60, check=False)


def test_serve_laya_dry_run_and_missing_checkpoint(models, tmp_path):
    prefix = tmp_path / "p"
    write_manifest(prefix, STRIX, layout="per-backend")
    r = _serve(prefix, "-m", str(models["dense"]), "--laya", "--dry-run")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["proxy"]["policy"] == "laya"
    assert plan["proxy"]["laya"]["model_dir"] == str(prefix.resolve() / "share/laya/checkpoint")
    assert plan["proxy"]["laya"]["policy"].endswith("laya-policy.json")
    assert [c["role"] for c in plan["children"]] == ["vulkan"]
    r = _serve(prefix, "-m", str(models["dense"]), "--laya-model", str(tmp_path / "ckpt"), "--dry-run",
               env={"ONEBIT_LAYA_MODEL": "/elsewhere"})
    assert json.loads(r.stdout)["proxy"]["laya"]["model_dir"] == str(tmp_path / "ckpt")
    r = _serve(prefix, "-m", str(models["dense"]), "--laya")  # no checkpoint installed: one line, nothing started
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"1bit serve: error: no Laya checkpoint at {prefix.resolve()}/share/laya/checkpoint: install the "
                        "bundle's laya package, or pass --laya-model DIR (or set $ONEBIT_LAYA_MODEL)\n")
    r = _serve(prefix, "-m", str(models["dense"]), "--laya", "--route-policy", str(tmp_path / "none.json"))
    assert r.returncode == 2 and r.stderr.startswith("1bit serve: error: no Laya policy at ")
