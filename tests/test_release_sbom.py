"""The CycloneDX SBOM: pins with commit, license and purl; patches as pedigree; wheels; toolchain; schema-valid."""
from __future__ import annotations

import datetime as dt
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
              "inputs": [{"tool": "nvcc", "package": "nvidia-cuda-nvcc", "version": "13.0.88", "sha256": "c" * 64}]}
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
    assert doc["metadata"]["component"]["version"] == "2026.48"
