"""ggml-vulkan's glslc probes -> the shader features a build dropped (a pure function, tested by table)."""
from __future__ import annotations

import pytest

from builders.kinds.vulkan_report import configure_note, dropped_shader_features, manifest_value, probes, report

# ggml-vulkan's configure at the llama.cpp pin on Debian 12 (glslc 2023.2, Vulkan headers 1.3.239), trimmed
DEBIAN12 = """\
-- Including CPU backend
-- Found Vulkan: /usr/lib/x86_64-linux-gnu/libvulkan.so (found version "1.3.239") found components: glslc missing components: glslangValidator
-- Vulkan found
-- GL_KHR_cooperative_matrix not supported by glslc
-- GL_NV_cooperative_matrix2 not supported by glslc
-- GL_NV_cooperative_matrix_decode_vector not supported by glslc
-- GL_EXT_integer_dot_product not supported by glslc
-- GL_EXT_bfloat16 not supported by glslc
-- GL_EXT_float_e2m1 not supported by glslc
-- GL_EXT_float_e4m3 not supported by glslc
-- Including Vulkan backend
"""

ALL = ["GL_KHR_cooperative_matrix", "GL_NV_cooperative_matrix2", "GL_NV_cooperative_matrix_decode_vector",
       "GL_EXT_integer_dot_product", "GL_EXT_bfloat16", "GL_EXT_float_e2m1", "GL_EXT_float_e4m3"]

NEWER = """\
-- GL_KHR_cooperative_matrix supported by glslc
-- GL_NV_cooperative_matrix2 supported by glslc
-- GL_NV_cooperative_matrix_decode_vector not supported by glslc
-- GL_EXT_integer_dot_product supported by glslc
-- GL_EXT_bfloat16 supported by glslc
-- GL_EXT_float_e2m1 not supported by glslc
-- GL_EXT_float_e4m3 not supported by glslc
"""


@pytest.mark.parametrize("output, dropped", [
    (DEBIAN12, ALL),
    (NEWER, ["GL_NV_cooperative_matrix_decode_vector", "GL_EXT_float_e2m1", "GL_EXT_float_e4m3"]),
    ("".join(f"-- {e} supported by glslc\n" for e in ALL), []),
    # not a Vulkan configure at all (the CPU variant): nothing probed, nothing dropped
    ("-- Including CPU backend\n-- Configuring done\n", []),
    ("", []),
    # a probe a later pin adds is reported by its own name, never lost
    ("-- GL_EXT_shader_fancy_new not supported by glslc\n", ["GL_EXT_shader_fancy_new"]),
    # a log line without CMake's STATUS prefix, and Windows line ends
    ("GL_EXT_bfloat16 not supported by glslc\r\n", ["GL_EXT_bfloat16"]),
    # a re-configure in one log: the last answer wins
    ("-- GL_EXT_bfloat16 not supported by glslc\n-- GL_EXT_bfloat16 supported by glslc\n", []),
    ("-- GL_EXT_bfloat16 supported by glslc\n-- GL_EXT_bfloat16 not supported by glslc\n", ["GL_EXT_bfloat16"]),
    # other text that merely mentions glslc is not a probe
    (("-- Found Vulkan: x found components: glslc missing components: glslangValidator\n"
      "CMake Warning: GL_EXT_bfloat16 not supported by glslc (quoted in prose)\n"), []),
])
def test_dropped_shader_features(output, dropped):
    assert [f.extension for f in dropped_shader_features(output)] == dropped


def test_known_features_name_their_define_and_what_goes():
    coopmat = dropped_shader_features(DEBIAN12)[0]
    assert coopmat.define == "GGML_VULKAN_COOPMAT_GLSLC_SUPPORT"
    assert coopmat.line() == ("GL_KHR_cooperative_matrix: cooperative-matrix (KHR_coopmat) matmul and flash-attention "
                              "shaders (GGML_VULKAN_COOPMAT_GLSLC_SUPPORT off)")
    unknown = dropped_shader_features("-- GL_EXT_x not supported by glslc")[0]
    assert (unknown.define, unknown.line()) == (None, "GL_EXT_x: shaders that need GL_EXT_x")


def test_probes_and_report():
    assert probes(NEWER)["GL_KHR_cooperative_matrix"] is True
    assert probes(NEWER)["GL_EXT_float_e4m3"] is False
    text = report(DEBIAN12)
    assert text.splitlines()[0].startswith("ggml-vulkan: this glslc lacks 7 shader extension(s)")
    assert len(text.splitlines()) == 8
    assert "  - GL_EXT_integer_dot_product: integer-dot (int8 dp4a) quantized matmul shaders" in text
    assert report("".join(f"-- {e} supported by glslc\n" for e in ALL)) is None
    assert report("") is None


def test_manifest_value_is_sorted():
    assert manifest_value(NEWER) == ["GL_EXT_float_e2m1", "GL_EXT_float_e4m3", "GL_NV_cooperative_matrix_decode_vector"]
    assert manifest_value("") == []


def test_configure_note_reads_only_the_configure():
    assert configure_note(0, DEBIAN12) == report(DEBIAN12)
    assert configure_note(1, DEBIAN12) is None  # `cmake --build` output is not a configure
    assert configure_note(0, "-- Configuring done\n") is None
