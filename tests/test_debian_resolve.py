"""debian_resolve is pure: tables over small Packages texts (the fields Debian's archive writes) -> the closure."""
from __future__ import annotations

import textwrap

import pytest

from builders.roots import debian_resolve as dr
from builders.roots.assemble import parse_packages


def stanza(name: str, version: str = "1.0-1", **fields: str) -> str:
    lines = [f"Package: {name}", f"Version: {version}", f"Architecture: {fields.pop('arch', 'amd64')}"]
    lines += [f"{k.replace('_', '-').title().replace('Sha256', 'SHA256')}: {v}" for k, v in fields.items()]
    lines += [f"Filename: pool/main/{name[0]}/{name}/{name}_{version}_amd64.deb", f"Size: {len(name) * 100}",
              f"SHA256: {'0' * 63}{len(name) % 10}"]
    return "\n".join(lines) + "\n"


def index(*suites: tuple[str, list[str]]) -> dr.Index:
    """The index as `roots resolve` makes it: from the Packages texts, each stanza parsed when first asked for."""
    return dr.index([(name, "\n".join(stanzas)) for name, stanzas in suites])


def test_parsed_stanzas_and_the_text_give_one_index():
    text = "\n".join(SID)
    a = dr.resolve(dr.index([("sid", text)]), [dr.Request("app"), dr.Request("mawk")])
    b = dr.resolve(dr.index([("sid", parse_packages(text))]), [dr.Request("app"), dr.Request("mawk")])
    assert a == b and {c.pkg.name for c in a} >= {"app", "mawk", "base-files", "bash"}


def closure(idx: dr.Index, *requests: str, essential: bool = False) -> dict[str, str]:
    return {c.pkg.name: f"{c.pkg.version}@{c.pkg.suite}"
            for c in dr.resolve(idx, [dr.Request.parse(r) for r in requests], essential=essential)}


SID = [
    stanza("app", depends="libfoo1 (>= 1.0), awk", pre_depends="libc6 (>= 2.36)", recommends="docs"),
    stanza("libfoo1", "1.2-1", depends="libc6"),
    stanza("libc6", "2.43-7"),
    stanza("mawk", "1.3.4-2", provides="awk"),
    stanza("gawk", "5.3-1", provides="awk"),
    stanza("docs"),
    stanza("base-files", "14.2", essential="yes"),
    stanza("bash", "5.3-4", essential="yes", pre_depends="libc6"),
]


@pytest.mark.parametrize("requests, essential, want", [
    # Depends + Pre-Depends, never Recommends; a virtual package by its first provider in (suite, priority, name) order
    (("app",), False, {"app": "1.0-1@sid", "libfoo1": "1.2-1@sid", "libc6": "2.43-7@sid", "gawk": "5.3-1@sid"}),
    # a provider the root already has wins over the first in order
    (("mawk", "app"), False, {"app": "1.0-1@sid", "libfoo1": "1.2-1@sid", "libc6": "2.43-7@sid", "mawk": "1.3.4-2@sid"}),
    # the base suite's Essential: yes packages (and what they need) are in every root
    (("libfoo1",), True, {"libfoo1": "1.2-1@sid", "libc6": "2.43-7@sid", "base-files": "14.2@sid", "bash": "5.3-4@sid"}),
])
def test_depends_predepends_provides_essential(requests, essential, want):
    assert closure(index(("sid", SID)), *requests, essential=essential) == want


SUITES = (("sid", [stanza("tool", "1.0-1", depends="libtool1 (>= 1.0)"), stanza("libtool1", "1.0-1"),
                   stanza("needs-new", depends="libtool1 (>= 2.0)")]),
          ("experimental", [stanza("tool", "2.0-1~exp1", depends="libtool1 (= 2.0-1~exp1)"),
                            stanza("libtool1", "2.0-1~exp1")]))


@pytest.mark.parametrize("requests, want", [
    # without a suite: the base's newest
    (("tool",), {"tool": "1.0-1@sid", "libtool1": "1.0-1@sid"}),
    # name/experimental: that suite's newest, and what its constraints need from there
    (("tool/experimental",), {"tool": "2.0-1~exp1@experimental", "libtool1": "2.0-1~exp1@experimental"}),
    # what only experimental can satisfy comes from experimental, the rest from the base
    (("needs-new",), {"needs-new": "1.0-1@sid", "libtool1": "2.0-1~exp1@experimental"}),
    # found out late: libtool1 1.0 was chosen for tool, then needs-new wants >= 2.0: libtool1 is re-decided from the
    # start (tool 1.0's libtool1 (>= 1.0) holds for 2.0 too, so tool stays in the base)
    (("tool", "needs-new"), {"tool": "1.0-1@sid", "libtool1": "2.0-1~exp1@experimental", "needs-new": "1.0-1@sid"}),
    (("needs-new", "tool/experimental"), {"tool": "2.0-1~exp1@experimental", "libtool1": "2.0-1~exp1@experimental",
                                          "needs-new": "1.0-1@sid"}),
])
def test_suite_preference_and_conflicts_re_decided(requests, want):
    assert closure(index(*SUITES), *requests) == want


def test_the_rocm_shape_a_dev_package_follows_its_runtime_into_experimental():
    """hipcc/experimental needs libamdhip64-dev (>= 7.1~), whose runtime needs libamd-comgr3 (>= 7.2~); sid's
    libamd-comgr-dev 7.0.2 pins libamd-comgr3 (= 7.0.2): the dev package is re-decided into experimental."""
    sid = [stanza("libamd-comgr-dev", "7.0.2-3", depends="libamd-comgr3 (= 7.0.2-3)"), stanza("libamd-comgr3", "7.0.2-3"),
           stanza("libamdhip64-dev", "6.4.3-5", depends="libamd-comgr-dev")]
    exp = [stanza("hipcc", "7.2.4-1~exp1", depends="libamdhip64-dev (>= 7.1.0~)"),
           stanza("libamdhip64-dev", "7.2.4-1~exp2", depends="libamd-comgr-dev, libamdhip64-7 (= 7.2.4-1~exp2)"),
           stanza("libamdhip64-7", "7.2.4-1~exp2", depends="libamd-comgr3 (>= 7.2.0~)"),
           stanza("libamd-comgr-dev", "7.2.4-1~exp1", depends="libamd-comgr3 (= 7.2.4-1~exp1)"),
           stanza("libamd-comgr3", "7.2.4-1~exp1")]
    got = closure(index(("sid", sid), ("experimental", exp)), "hipcc/experimental")
    assert got == {"hipcc": "7.2.4-1~exp1@experimental", "libamdhip64-dev": "7.2.4-1~exp2@experimental",
                   "libamdhip64-7": "7.2.4-1~exp2@experimental", "libamd-comgr-dev": "7.2.4-1~exp1@experimental",
                   "libamd-comgr3": "7.2.4-1~exp1@experimental"}


@pytest.mark.parametrize("depends, want", [
    ("python3:any", {"python3"}),  # an arch qualifier names the same package
    ("winlib [!amd64] | libc6", {"libc6"}),  # an alternative for other architectures is dropped
    ("libc6 [amd64]", {"libc6"}),
    ("missing | libc6", {"libc6"}),  # the first alternative that can be satisfied
    ("libfoo-abi (>= 2)", {"libfoo2"}),  # a versioned Provides meets a versioned dependency
    ("awk (>= 1)", {"gawk-new"}),  # an unversioned Provides does not: only the versioned provider does
])
def test_relation_fields(depends, want):
    idx = index(("sid", [stanza("top", depends=depends), stanza("python3", "3.14.8-1"), stanza("libc6", "2.43-7"),
                         stanza("winlib"), stanza("libfoo2", "2.1-1", provides="libfoo-abi (= 2)"),
                         stanza("mawk", provides="awk"), stanza("gawk-new", provides="awk (= 5.3)"),
                         stanza("i386-only", arch="i386")]))
    assert set(closure(idx, "top")) - {"top"} == want


@pytest.mark.parametrize("stanzas, requests, message", [
    ([stanza("a", depends="b (>= 2)"), stanza("b", "1.0-1")], ("a",),
     "b (>= 2): nothing in sid satisfies it (have: b 1.0-1 (sid)); needed by a 1.0-1"),
    ([stanza("a", depends="nothing-provides-this")], ("a",), "nothing-provides-this: nothing in sid satisfies it; needed by a 1.0-1"),
    ([stanza("a")], ("a/experimental",), "a/experimental: suite 'experimental' is not one of the root's suites (sid)"),
    ([stanza("i386-only", arch="i386")], ("i386-only",), "i386-only: nothing in sid satisfies it; needed by the root's request"),
])
def test_what_cannot_be_satisfied_is_named_with_its_chain(stanzas, requests, message):
    with pytest.raises(dr.ResolveError) as err:
        closure(index(("sid", stanzas)), *requests)
    assert message in str(err.value)


@pytest.mark.parametrize("version, constraint, ok", [
    ("1.0-1", None, True), (None, None, True), (None, (">=", "1"), False),
    ("1:1.0-1", (">>", "2.0"), True),  # the epoch wins
    ("7.2.4~rc1-1", (">=", "7.2.4"), False), ("7.2.4-1~exp1", (">=", "7.2.0~"), True),  # ~ sorts before anything
    ("2.43-7", ("<<", "2.43-8"), True), ("2.43-7", ("=", "2.43-7"), True), ("2.43-7", ("<=", "2.43"), False),
])
def test_versions_compare_as_dpkg_does(version, constraint, ok):
    assert dr.satisfies(version, constraint) is ok


def test_the_packages_text_is_read_by_python_debian():
    text = textwrap.dedent("""\
        Package: a
        Version: 1.0-1
        Architecture: all
        Depends: b,
         c (>= 2)
        Description: folded
         lines
        Filename: pool/main/a/a/a_1.0-1_all.deb
        Size: 10
        SHA256: {sha}

        Package: b
        Version: 1.0-1
        Architecture: amd64
        Filename: pool/main/b/b/b_1.0-1_amd64.deb
        Size: 20
        SHA256: {sha}

        Package: c
        Version: 2.0-1
        Architecture: amd64
        Filename: pool/main/c/c/c_2.0-1_amd64.deb
        Size: 30
        SHA256: {sha}
        """).replace("{sha}", "f" * 64)
    got = dr.resolve(dr.index([("sid", parse_packages(text))]), [dr.Request("a")], essential=False)
    assert [(c.pkg.name, c.pkg.filename, c.pkg.size) for c in got] == [
        ("a", "pool/main/a/a/a_1.0-1_all.deb", 10), ("b", "pool/main/b/b/b_1.0-1_amd64.deb", 20),
        ("c", "pool/main/c/c/c_2.0-1_amd64.deb", 30)]
