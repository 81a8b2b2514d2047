"""treepath: where a path inside a tree really leads, following its links by their text, never through the host.

One pure resolver for every reader and unpacker of untrusted trees (the pin bot's reading of upstream build files,
and builders/io/archives.py, the one unpacker of .deb, tar, zip and wheel archives): it walks the path component by component, asks `readlink` for the text of each
link (None: not a link), and answers the tree-relative path it leads to, or None when it leaves the tree, loops,
or takes more than MAX_LINKS links. It never calls the host's realpath (whose PATH_MAX overflow on long link chains
is what let a crafted tar write outside its root on CPython before 3.11.13 / 3.12.11).

absolute: what a link to "/x" means: "refuse" (a checkout: a link out of the tree) or "reroot" (a package unpacked
into a root: "/x" is the root's x, as it would be once the root is the system).
"""
from __future__ import annotations

from collections.abc import Callable
from posixpath import normpath, relpath

MAX_LINKS = 40  # what Linux follows (ELOOP)
MAX_DEPTH = 256  # components in one path


def resolve(path: str, readlink: Callable[[str], str | None], *, absolute: str = "refuse",
            follow_last: bool = True) -> str | None:
    """The tree-relative path `path` leads to ("" is the tree's top), or None (out of the tree, a loop, too deep)."""
    todo = [c for c in path.split("/") if c not in ("", ".")][::-1]
    if path.startswith("/"):
        if absolute != "reroot":
            return None
    out: list[str] = []
    links = 0
    while todo:
        c = todo.pop()
        if c in ("", "."):
            continue
        if c == "..":
            if not out:
                return None  # climbs above the top
            out.pop()
            continue
        if len(out) >= MAX_DEPTH:
            return None
        here = "/".join(out + [c])
        target = readlink(here) if (todo or follow_last) else None
        if target is None:
            out.append(c)
            continue
        links += 1
        if links > MAX_LINKS or not target or "\0" in target:
            return None
        if target.startswith("/"):
            if absolute != "reroot":
                return None
            out = []
        todo.extend([x for x in target.split("/") if x not in ("", ".")][::-1])
    return "/".join(out)


def link_in_root(member: str, target: str, readlink: Callable[[str], str | None], *,
                 absolute: str = "reroot") -> str | None:
    """Pure: the link text to write for a link `member` -> `target` unpacked into a root, or None to skip it.

    The link lives where its parent directory resolves (through links already known); a relative target is kept as
    written when it leads inside the root; an absolute one (/lib64/ld-linux-x86-64.so.2 -> /lib/x86_64-linux-gnu/...)
    is kept re-rooted, as the relative link from that directory to the same place, when it leads inside the root and
    `absolute` is "reroot" (a package unpacked into a build root), and skipped when it is "refuse" (any other archive:
    "/x" is the host's x); anything that leaves the root (or loops) is skipped."""
    member = member.strip("/")
    if not member or not target or "\0" in target:
        return None
    parent = resolve(member.rpartition("/")[0], readlink, absolute=absolute)
    if parent is None:
        return None
    if target.startswith("/"):
        if absolute != "reroot" or resolve(target, readlink, absolute="reroot") is None:
            return None
        text = relpath(normpath("/" + target.lstrip("/")), "/" + parent if parent else "/")
        return text if text != "." else None
    joined = f"{parent}/{target}" if parent else target
    if resolve(joined, readlink, absolute=absolute) is None:
        return None
    return target
