"""A small but real project for the build-side tests: a C library + program in a real git repo (the upstream),
pinned in a pins.yaml with file:// mirrors, a recipe with a real patch, and a bundle. Builds in seconds."""
from __future__ import annotations

import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml

CMAKELISTS = """\
cmake_minimum_required(VERSION 3.16)
project(hello C)
set(HELLO_COMMIT "unknown" CACHE STRING "commit the build is from")
add_library(greet SHARED greet.c)
add_executable(hello main.c)
target_compile_definitions(hello PRIVATE HELLO_COMMIT="${HELLO_COMMIT}")
target_link_libraries(hello PRIVATE greet)
include(GNUInstallDirs)
install(TARGETS hello greet)
"""
GREET_C = """\
#include <stdio.h>
void greet(void) { printf("hello from upstream\\n"); }
"""
MAIN_C = """\
#include <stdio.h>
#include <string.h>
void greet(void);
int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--version") == 0) { printf("hello version (%s)\\n", HELLO_COMMIT); return 0; }
    greet();
    return 0;
}
"""
PATCH = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: onebit <onebit@localhost>
Subject: [PATCH] greet: say who we are

---
 greet.c | 2 +-
 1 file changed, 1 insertion(+), 1 deletion(-)

diff --git a/greet.c b/greet.c
--- a/greet.c
+++ b/greet.c
@@ -1,2 +1,2 @@
 #include <stdio.h>
-void greet(void) { printf("hello from upstream\\n"); }
+void greet(void) { printf("hello from onebit\\n"); }
"""


def git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout.strip()


@dataclass
class Mini:
    root: Path  # the project: pins.yaml, recipes/, bundles/
    upstream: Path  # the upstream git repo
    commit: str  # the pinned commit (tag v1.0)

    def without_sysroot(self) -> "Mini":
        """The project's floor less its pinned sysroot: a test that builds --offline with a fresh cache (the release's,
        a partial mirror's) has no Debian packages to assemble it from; the host's C library is then what it links."""
        floor = (Path(__file__).resolve().parent.parent / "floor.yaml").read_text()
        (self.root / "floor.yaml").write_text(floor[:floor.index("\ntoolchain:")] + "\n")
        return self

    def pins(self) -> dict:
        return yaml.safe_load((self.root / "pins.yaml").read_text())

    def write_pins(self, data: dict) -> None:
        (self.root / "pins.yaml").write_text(yaml.safe_dump(data, sort_keys=False))

    def set_pin(self, **fields) -> None:
        data = self.pins()
        data["pins"]["hello"].update(fields)
        self.write_pins(data)

    def recipe(self) -> dict:
        return yaml.safe_load((self.root / "recipes" / "hello.yaml").read_text())

    def write_recipe(self, data: dict) -> None:
        (self.root / "recipes" / "hello.yaml").write_text(yaml.safe_dump(data, sort_keys=False))

    def commit_upstream(self, path: str, text: str, message: str) -> str:
        (self.upstream / path).write_text(text)
        git(self.upstream, "commit", "-qam", message)
        return git(self.upstream, "rev-parse", "HEAD")


def git_repo(path: Path, files: dict[str, str], message: str, tag: str | None = None) -> str:
    """A new git repository at path (branch main) holding files in one commit, tagged `tag`: the commit."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in files.items():
        (path / name).write_text(text)
    git(path, "add", ".")
    git(path, "commit", "-qm", message)
    if tag:
        git(path, "tag", tag)
    return git(path, "rev-parse", "HEAD")


def make_mini(base: Path) -> Mini:
    upstream = base / "upstream"
    commit = git_repo(upstream, {"CMakeLists.txt": CMAKELISTS, "greet.c": GREET_C, "main.c": MAIN_C}, "hello 1.0", "v1.0")

    root = base / "project"
    (root / "recipes" / "patches" / "hello").mkdir(parents=True)
    (root / "bundles").mkdir()
    (root / "recipes" / "patches" / "hello" / "0001-greet-say-who-we-are.patch").write_text(PATCH)
    (root / "pins.yaml").write_text(textwrap.dedent(f"""\
        # test pins
        schema_version: 1
        pins:
          hello:
            url: file://{upstream}
            policy: release
            tag: v1.0
            commit: {commit}
            cadence: daily
            license: MIT
            mirrors:
              - git: file://{upstream}
        """))
    (root / "recipes" / "hello.yaml").write_text(textwrap.dedent("""\
        schema_version: 1
        name: hello
        summary: a tiny C program and library
        license: MIT
        source:
          pin: hello
          patches:
            - file: 0001-greet-say-who-we-are.patch
              purpose: prove patches are applied
              upstream: not for upstream
        toolchain:
          - {tool: cmake, version: ">=3.16"}
          - {tool: ninja}
          - {tool: cc}
          - {tool: patchelf}
          - {tool: ccache, optional: true}
        build:
          kind: cmake
          options:
            HELLO_COMMIT: "{commit7}"
        stage:
          keep: [bin/hello, lib/libgreet.so*]
          binaries:
            hello: bin/hello
        provides:
          backend: cpu
          devices: [CPU]
          features: []
        tests:
          - name: version names the commit
            run: [bin/hello, --version]
            expect: "\\\\({commit7}\\\\)"
          - name: the patched greeting
            run: [bin/hello]
            expect: "hello from onebit"
        """))
    write_bundle(root, "hello")
    return Mini(root=root, upstream=upstream, commit=commit)


def write_bundle(root: Path, recipe: str) -> None:
    """bundles/mini.yaml: the mini bundle of one recipe."""
    (root / "bundles" / "mini.yaml").write_text(textwrap.dedent(f"""\
        schema_version: 1
        name: mini
        summary: the mini bundle
        version: "1.0"
        platform: linux-64
        components:
          - recipe: {recipe}
        """))


def add_rooted(mini: Mini, root: str, root_yaml: str, **recipe_fields) -> None:
    """The mini project built inside a pinned root: roots/<root>.yaml, the recipe `rooted` (the hello recipe on its
    pin and patches, with recipe_fields) and the mini bundle of it alone."""
    (mini.root / "roots").mkdir()
    (mini.root / "roots" / f"{root}.yaml").write_text(root_yaml)
    recipe = mini.recipe()
    recipe.update(name="rooted", **recipe_fields)
    recipe["source"].update(patch_dir="hello")
    (mini.root / "recipes" / "rooted.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    write_bundle(mini.root, "rooted")


def add_twin(mini: Mini, name: str = "hello2", backend: str | None = None, **build) -> None:
    """A second recipe on the same pin and patches (so the same checkout), staged in its own subtree, and both in the
    mini bundle: how cpu, vulkan and cuda share one patched llama.cpp checkout. `build` is merged into both recipes'
    build sections (e.g. build_type=RelWithDebInfo, so debug info records the build dirs). `backend`: the twin's
    manifest backend (a name the manifest schema knows), None for a non-backend part."""
    recipe = mini.recipe()
    recipe["build"].update(build)
    mini.write_recipe(recipe)
    twin = {**recipe, "name": name, "source": {**recipe["source"], "patch_dir": "hello"},
            "stage": {**recipe["stage"], "root": f"libexec/{name}"}, "provides": {**recipe["provides"], "backend": backend}}
    (mini.root / "recipes" / f"{name}.yaml").write_text(yaml.safe_dump(twin, sort_keys=False))
    bundle = yaml.safe_load((mini.root / "bundles" / "mini.yaml").read_text())
    bundle["components"].append({"recipe": name})
    (mini.root / "bundles" / "mini.yaml").write_text(yaml.safe_dump(bundle, sort_keys=False))
