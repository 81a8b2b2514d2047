"""The CycloneDX SBOM: pins with commit, license and purl; patches as pedigree; wheels; toolchain; schema-valid."""
from __future__ import annotations

import datetime as dt
import hashlib
import json

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from builders.release import sbom

TS = dt.datetime(2026, 11, 29, tzinfo=dt.UTC)


@pytest.mark.parametrize("url, purl", [
    ("https://github.com/ggml-org/llama.cpp.git", "pkg:github/ggml-org/llama.cpp@" + "a" * 40),
    ("git@github.com:o/r.git", "pkg:github/o/r@" + "a" * 40),
    ("https://example.org/zinc.git", "pkg:generic/x@" + "a" * 40 + "?vcs_url=git%2Bhttps://example.org/zinc.git%40" + "a" * 40),
])
def test_pin_purl(url, purl):
    assert sbom.pin_purl(sbom.PinInfo("x", url, "a" * 40, "MIT")).to_string() == purl


def test_sbom(tmp_path):
    patch = tmp_path / "0001-fix.patch"
    patch.write_text("diff --git a/x b/x\n")
    wheel = tmp_path / "Jinja2-3.1.4-py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    pins = [sbom.PinInfo("llama.cpp", "https://github.com/ggml-org/llama.cpp.git", "a" * 40, "MIT"),
            sbom.PinInfo("hrx-system", "https://github.com/ROCm/hrx-system.git", "b" * 40,
                         "Apache-2.0 WITH LLVM-exception")]
    kw = {"tag": "v2026.48", "version": "2026.48", "pins": pins, "patches": {"llama.cpp": [patch]}, "wheels": [wheel],
              "toolchain": [("gcc", "12.2.0"), ("cmake", "3.31.6"), ("cmake", "3.28.3")], "timestamp": TS,
              "inputs": [{"tool": "nvcc", "package": "nvidia-cuda-nvcc", "version": "13.0.88", "sha256": "c" * 64},
                         # a Debian input as toolchain.json records it: by its file (the floor's sysroot)
                         {"tool": "sysroot", "package": "libc6_2.36-9+deb12u14_amd64.deb", "sha256": "d" * 64}]}
    text = sbom.make_sbom(**kw)
    assert text == sbom.make_sbom(**kw)  # deterministic
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    doc = json.loads(text)
    comps = {c["bom-ref"]: c for c in doc["components"]}
    llama = comps["pin:llama.cpp"]
    assert llama["version"] == "a" * 40 and llama["purl"] == "pkg:github/ggml-org/llama.cpp@" + "a" * 40
    assert llama["licenses"] == [{"expression": "MIT"}]
    assert llama["pedigree"]["patches"][0]["type"] == "unofficial"
    assert llama["pedigree"]["patches"][0]["diff"]["text"]["content"] == "diff --git a/x b/x\n"
    assert "pedigree" not in comps["pin:hrx-system"]
    w = comps["wheel:Jinja2-3.1.4-py3-none-any.whl"]
    assert (w["name"], w["version"], w["purl"]) == ("jinja2", "3.1.4", "pkg:pypi/jinja2@3.1.4")
    # two runners, two cmakes: each version the jobs reported is listed
    assert sorted((t["name"], t["version"]) for t in doc["metadata"]["tools"]["components"]) == [
        ("cmake", "3.28.3"), ("cmake", "3.31.6"), ("gcc", "12.2.0")]
    nvcc = comps["input:nvidia-cuda-nvcc@13.0.88"]
    assert nvcc["purl"] == "pkg:pypi/nvidia-cuda-nvcc@13.0.88" and nvcc["hashes"] == [{"alg": "SHA-256", "content": "c" * 64}]
    libc = comps["input:deb:libc6@2.36-9+deb12u14"]
    assert libc["purl"] == "pkg:deb/debian/libc6@2.36-9%2Bdeb12u14?arch=amd64" and libc["hashes"][0]["content"] == "d" * 64
    assert doc["metadata"]["component"]["version"] == "2026.48"


# ---- the redistributables a bundle ships (NVIDIA's cudart, cuBLAS, cuBLASLt in the cuda subtree) -----------------------


def _bundle(tmp_path, name, *, override=False):
    """An installed bundle whose cuda subtree the stage step laid out: toolchain.ship, for real."""
    from test_lemonade import build_prefix, ship_cuda_runtime, toolkit_root

    prefix = build_prefix(tmp_path / name, ("cpu", "cuda"))
    ship_cuda_runtime(prefix, toolkit_root(tmp_path / name / "tk", override=override))
    return prefix


def test_every_redistributable_a_bundle_ships_is_named_with_license_and_files(tmp_path):
    from test_lemonade import CUDA_RUNTIME

    sm90, sm120 = _bundle(tmp_path, "sm90"), _bundle(tmp_path, "sm120")  # two flavors, the same wheels
    shipped = sbom.read_redistributables(sm90) + sbom.read_redistributables(sm120)
    assert sorted(r.package for r in shipped) == sorted(2 * list(CUDA_RUNTIME))
    runtime_sha = hashlib.sha256(b"nvidia-cuda-runtime").hexdigest()  # the wheel's, as toolkit_root records it
    inputs = [{"tool": "nvcc", "package": "nvidia-cuda-runtime", "version": "13.0.96", "sha256": runtime_sha},
              {"tool": "nvcc", "package": "nvidia-cuda-nvcc", "version": "13.0.88", "sha256": "c" * 64}]
    kw = {"tag": "v2026.48", "version": "2026.48", "pins": [], "patches": {}, "wheels": [], "toolchain": [],
          "timestamp": TS, "inputs": inputs, "redistributables": shipped}
    text = sbom.make_sbom(**kw)
    assert text == sbom.make_sbom(**kw)
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    comps = {c["bom-ref"]: c for c in json.loads(text)["components"]}
    # one component per wheel, however many bundles ship it; the toolchain input it also is, folded into it
    assert sorted(comps) == ["input:nvidia-cuda-nvcc@13.0.88", "redist:nvidia-cublas@13.1.0.3",
                             "redist:nvidia-cuda-runtime@13.0.96"]
    cublas = comps["redist:nvidia-cublas@13.1.0.3"]
    assert cublas["purl"] == "pkg:pypi/nvidia-cublas@13.1.0.3"
    assert cublas["hashes"] == [{"alg": "SHA-256", "content": hashlib.sha256(b"nvidia-cublas").hexdigest()}]
    [lic] = cublas["licenses"]
    assert lic["license"]["name"] == "LicenseRef-NVIDIA-Proprietary"
    assert lic["license"]["text"]["content"] == "NVIDIA Software License Agreement (nvidia-cublas)\n"
    files = {p["name"].removeprefix("onebit:file:"): p["value"] for p in cublas["properties"]
             if p["name"].startswith("onebit:file:")}
    assert files == {f"libexec/onebit/cuda/lib/{lib}": hashlib.sha256((sm90 / "libexec/onebit/cuda/lib" / lib)
                                                                      .read_bytes()).hexdigest()
                     for lib in ("libcublas.so.13", "libcublasLt.so.13")}
    runtime = {p["name"]: p["value"] for p in comps["redist:nvidia-cuda-runtime@13.0.96"]["properties"]}
    assert runtime["onebit:toolchain-input"] == "nvcc" and runtime["onebit:redistributable"] == "pinned wheel"


def test_an_override_toolkits_redistributable_is_named_without_version_or_hash(tmp_path):
    shipped = sbom.read_redistributables(_bundle(tmp_path, "own", override=True))
    assert {(r.package, r.version, r.wheel_sha256, r.toolkit) for r in shipped} == {
        ("nvidia-cuda-runtime", None, None, "override"), ("nvidia-cublas", None, None, "override")}
    text = sbom.make_sbom(tag="v2026.48", version="2026.48", pins=[], patches={}, wheels=[], toolchain=[],
                          timestamp=TS, redistributables=shipped)
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    comp = {c["bom-ref"]: c for c in json.loads(text)["components"]}["redist:nvidia-cublas@override"]
    assert "version" not in comp and "hashes" not in comp and "purl" not in comp
    assert "override toolkit" in comp["description"]
    props = {p["name"]: p["value"] for p in comp["properties"]}
    assert props["onebit:toolkit"] == "override" and props["onebit:redistributable"] == "override toolkit"
    assert "libexec/onebit/cuda/lib/libcublasLt.so.13" in {n.removeprefix("onebit:file:") for n in props}
    assert comp["licenses"][0]["license"]["text"]["content"] == "End User License Agreement (CUDA Toolkit)\n"


def test_what_redistributables_json_names_must_be_in_the_bundle(tmp_path):
    from builders.errors import OnebitError
    from builders.inputs.toolchain import REDISTRIBUTABLES

    prefix = _bundle(tmp_path, "b")
    sub = prefix / "libexec/onebit/cuda"
    lt = sub / "lib/libcublasLt.so.13"
    lt.write_bytes(lt.read_bytes() + b"\0")
    with pytest.raises(OnebitError, match="nvidia-cublas: libexec/onebit/cuda/lib/libcublasLt.so.13 is not the file"):
        sbom.read_redistributables(prefix)
    lt.unlink()
    with pytest.raises(OnebitError, match="libcublasLt.so.13 is missing"):
        sbom.read_redistributables(prefix)
    (sub / "share/licenses/nvidia-cuda-runtime/License.txt").unlink()
    with pytest.raises(OnebitError, match="its license file libexec/onebit/cuda/share/licenses/nvidia-cuda-runtime/"
                                          "License.txt is not in the bundle"):
        sbom.read_redistributables(prefix)
    (sub / REDISTRIBUTABLES).write_text('{"redistributables": [\n  {"package": }\n]}\n')
    with pytest.raises(OnebitError) as e:
        sbom.read_redistributables(prefix)
    assert str(e.value).startswith(f"{sub / REDISTRIBUTABLES}:2: not JSON")
