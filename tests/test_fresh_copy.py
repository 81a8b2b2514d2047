"""`nox -s fresh` copies the checkout into each clean root (builders/roots/checkout.py `copy_checkout`, as fresh's
`run_suite` calls it): links are copied as links when they stay inside the checkout and skipped, in one line, when they
lead out; nothing is read or written through a link, so no byte lands outside the root's copy. Real git, real links,
real files."""
from __future__ import annotations

import os
from pathlib import Path

from builders import fresh
from builders.roots import checkout
from mini_project import git


def snapshot(top: Path, skip: Path) -> dict[str, tuple]:
    """Every entry under top but `skip`: (kind, bytes or link text, mtime) - what 'nothing written there' compares."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d != skip]
        for name in dirnames + filenames:
            p = here / name
            st = os.lstat(p)
            if p.is_symlink():
                out[str(p)] = ("link", os.readlink(p), st.st_mtime_ns)
            elif p.is_file():
                out[str(p)] = ("file", p.read_bytes(), st.st_mtime_ns)
            else:
                out[str(p)] = ("dir", None, None)
    return out


def test_links_out_of_the_checkout_are_skipped_in_one_line_and_nothing_is_written_through_them(tmp_path, capsys):
    host = tmp_path / "host"  # a folder of the host that a link of the checkout names
    host.mkdir()
    (host / "a.md").write_text("the host's own a.md\n")
    (host / "b.md").write_text("the host's own b.md\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("not the checkout's\n")

    src = tmp_path / "checkout"
    (src / "docs").mkdir(parents=True)
    (src / "sub").mkdir()
    (src / "docs" / "a.md").write_text("checkout a\n")
    (src / "docs" / "b.md").write_text("checkout b\n")
    (src / "top.txt").write_text("top\n")
    (src / "sub" / "real.txt").write_text("real\n")
    (src / "tool.sh").write_text("#!/bin/sh\n")
    (src / "tool.sh").chmod(0o755)
    git(src, "init", "-q", "-b", "main")
    git(src, "add", ".")
    git(src, "commit", "-qm", "x")
    # the tracked folder docs/ replaced by an absolute link to the host folder (the old copy raised SameFileError
    # writing docs/a.md through the link it had just made), a file link out, a chain out, and links that stay inside
    for p in (src / "docs" / "a.md", src / "docs" / "b.md"):
        p.unlink()
    (src / "docs").rmdir()
    (src / "docs").symlink_to(host)
    (src / "escape.txt").symlink_to("../outside.txt")
    (src / "abs.txt").symlink_to(outside)
    (src / "c1").symlink_to("c2")
    (src / "c2").symlink_to("sub/../c3")
    (src / "c3").symlink_to("..")
    (src / "in1").symlink_to("in2")
    (src / "in2").symlink_to("sub/real.txt")
    (src / "sub" / "up").symlink_to("../top.txt")
    (src / "loop").symlink_to("loop")

    dest = tmp_path / "root" / "src" / "onebit-build"
    before = snapshot(tmp_path, tmp_path / "root")
    n = checkout.copy_checkout(src, dest, say=fresh.say)
    assert snapshot(tmp_path, tmp_path / "root") == before  # the host folder, the outside file, the checkout: untouched

    lines = [ln for ln in capsys.readouterr().out.splitlines() if "skipped" in ln]
    assert lines == [f"fresh: skipped 7 link(s) of the checkout that lead out of it or loop (not copied): abs.txt -> "
                     f"{outside}, c1 -> c2, c2 -> sub/../c3, c3 -> .., docs -> {host}, escape.txt -> ../outside.txt, "
                     "loop -> loop"], lines
    got = {str(p.relative_to(dest)): (os.readlink(p) if p.is_symlink() else p.read_text())
           for p in sorted(dest.rglob("*")) if p.is_symlink() or p.is_file()}
    assert got == {"top.txt": "top\n", "sub/real.txt": "real\n", "tool.sh": "#!/bin/sh\n", "in1": "in2",
                   "in2": "sub/real.txt", "sub/up": "../top.txt"}
    assert n == len(got) and os.access(dest / "tool.sh", os.X_OK)
    assert not os.path.lexists(dest / "docs") and not os.path.lexists(dest / "escape.txt")


def test_a_checkout_without_links_is_copied_whole_and_says_nothing(tmp_path, capsys):
    src = tmp_path / "checkout"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "f.txt").write_text("f\n")
    (src / ".gitignore").write_text("ignored.txt\n")
    (src / "ignored.txt").write_text("x\n")
    git(src, "init", "-q", "-b", "main")
    git(src, "add", ".")
    git(src, "commit", "-qm", "x")
    (src / "new.txt").write_text("untracked, not ignored\n")
    dest = tmp_path / "dest"
    assert checkout.copy_checkout(src, dest, say=fresh.say) == 3
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == [".gitignore", "a/b/f.txt", "new.txt"]
    assert "skipped" not in capsys.readouterr().out
