"""What ggml-vulkan's configure says about the shader compiler: which shader features the build drops.

ggml-vulkan's CMakeLists compiles one tiny test shader per GLSL extension with the glslc it found and prints
`-- <EXTENSION> supported by glslc` or `-- <EXTENSION> not supported by glslc`. An unsupported extension is not an
error: CMake leaves the matching GGML_VULKAN_*_GLSLC_SUPPORT define off and the backend is built without those
shaders (Debian 12's glslc 2023.2 lacks all of them). This module turns that output into a plain statement, so a
build says what it dropped instead of hiding it. Pure: text in, tuples out.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# ggml-vulkan's probes at the llama.cpp pin: GLSL extension -> (the CMake define it gates, what goes without it).
# An extension missing from this table is still reported, by its own name, so a new probe after a pin bump is
# never lost; it only lacks the friendlier description until this table learns it.
KNOWN: dict[str, tuple[str, str]] = {
    "GL_KHR_cooperative_matrix": ("GGML_VULKAN_COOPMAT_GLSLC_SUPPORT",
                                  "cooperative-matrix (KHR_coopmat) matmul and flash-attention shaders"),
    "GL_NV_cooperative_matrix2": ("GGML_VULKAN_COOPMAT2_GLSLC_SUPPORT",
                                  "NV_coopmat2 matmul and flash-attention shaders"),
    "GL_NV_cooperative_matrix_decode_vector": ("GGML_VULKAN_COOPMAT2_DECODE_VECTOR_GLSLC_SUPPORT",
                                               "coopmat2 vector dequantization"),
    "GL_EXT_integer_dot_product": ("GGML_VULKAN_INTEGER_DOT_GLSLC_SUPPORT",
                                   "integer-dot (int8 dp4a) quantized matmul shaders"),
    "GL_EXT_bfloat16": ("GGML_VULKAN_BFLOAT16_GLSLC_SUPPORT", "native bfloat16 shaders"),
    "GL_EXT_float_e2m1": ("GGML_VULKAN_FLOAT_E2M1_GLSLC_SUPPORT", "FP4 (e2m1) shaders"),
    "GL_EXT_float_e4m3": ("GGML_VULKAN_FLOAT_E4M3_GLSLC_SUPPORT", "FP8 (e4m3) shaders"),
}

# `-- GL_EXT_bfloat16 not supported by glslc`; the `-- ` is CMake's STATUS prefix, absent in some log captures
_PROBE = re.compile(r"^(?:-- )?(GL_[A-Za-z0-9_]+) (not supported|supported) by glslc\s*$")


@dataclass(frozen=True)
class ShaderFeature:
    extension: str  # the GLSL extension glslc lacks, e.g. GL_EXT_bfloat16
    define: str | None  # the CMake/compile define left off, when known
    what: str  # what the build goes without

    def line(self) -> str:
        gate = f" ({self.define} off)" if self.define else ""
        return f"{self.extension}: {self.what}{gate}"


def probes(output: str) -> dict[str, bool]:
    """Every glslc extension probe in configure output -> supported? The last answer wins (a re-configure)."""
    found: dict[str, bool] = {}
    for raw in output.splitlines():
        m = _PROBE.match(raw.strip())
        if m:
            found[m.group(1)] = m.group(2) == "supported"
    return found


def dropped_shader_features(output: str) -> tuple[ShaderFeature, ...]:
    """The shader features this configure dropped because glslc lacks their extension, in probe order."""
    dropped = []
    for ext, ok in probes(output).items():
        if ok:
            continue
        define, what = KNOWN.get(ext, (None, f"shaders that need {ext}"))
        dropped.append(ShaderFeature(ext, define, what))
    return tuple(dropped)


def report(output: str) -> str | None:
    """One message for the build log and console, or None when nothing was dropped (or nothing was probed)."""
    dropped = dropped_shader_features(output)
    if not dropped:
        return None
    head = (f"ggml-vulkan: this glslc lacks {len(dropped)} shader extension(s); the Vulkan backend is built "
            "without these (a newer glslc restores them):")
    lines = [head]
    lines += [f"  - {f.line()}" for f in dropped]
    return "\n".join(lines)


def manifest_value(output: str) -> list[str]:
    """The dropped extensions as the manifest records them (sorted, so the entry is stable)."""
    return sorted(f.extension for f in dropped_shader_features(output))


def configure_note(command_index: int, output: str) -> str | None:
    """Shaped like CMakeKind.check_output, but the message informs instead of failing: the cmake kind's
    command 0 is the configure; any other command, or a configure without glslc probes, gives None."""
    return report(output) if command_index == 0 else None
