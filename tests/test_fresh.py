"""The README on a stock distribution: its two commands (scripts/nox.py), CI's command, and `nox -s fresh`'s decisions
(builders/fresh.py): which host settings cross into a clean root and how, which mirror, what runs there. The roots
themselves are made by `nox -s fresh -- bookworm trixie` (and release.yml's fresh job)."""
from __future__ import annotations

import importlib.util
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from builders.io import archives
from builders.roots import debs
from builders import fresh
from builders.roots import checkout, clean, passthrough
from builders.ship import channels_check

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_has_two_commands_and_ci_runs_the_second():
    first, second = fresh.readme_commands((ROOT / "README.md").read_text())
    assert first == "python3 scripts/nox.py -s build-cpu" and second == "python3 scripts/nox.py -s tests"
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith(("#", "set ", "cd "))]
    assert ci == [second]
    # what fresh runs first in each root is the README's first command
    assert fresh.steps(first)[0].command == first


DEBIAN = [("http://mirror.example/debian", ("bookworm", "bookworm-updates")),
          ("http://mirror.example/debian-security", ("bookworm-security",))]
UBUNTU = [("http://archive.example/ubuntu", ("noble", "noble-updates")),
          ("http://security.example/ubuntu", ("noble-security",))]


@pytest.mark.parametrize("env, sources, want", [
    ({}, DEBIAN, "http://mirror.example/debian"),  # the host's Debian archive, not its security archive
    ({}, UBUNTU + DEBIAN, "http://mirror.example/debian"),  # an Ubuntu archive serves no Debian suite
    ({}, UBUNTU, None),  # nothing to make a Debian root from: the caller names ONEBIT_DEBIAN_MIRROR
    ({"ONEBIT_DEBIAN_MIRROR": "http://other.example/debian/ http://x"}, UBUNTU, "http://other.example/debian"),
    ({}, [("http://m.example/debian", ("trixie",))], "http://m.example/debian"),
    ({}, [("http://m.example/debian", ("sid",))], "http://m.example/debian"),
])
def test_debian_mirror(env, sources, want):
    assert clean.debian_mirror(env, sources) == want


def test_debian_mirror_reads_the_sources_format_apt_uses():
    deb822 = debs.parse_sources("Types: deb\nURIs: http://mirror.example/debian\nSuites: trixie trixie-updates\n"
                                "Components: main\n", deb822=True)
    assert clean.debian_mirror({}, deb822) == "http://mirror.example/debian"


def test_apt_options_are_the_ones_about_reaching_the_archive():
    dump = ('APT "";\nAPT::Sandbox::User "_apt";\nAcquire::Check-Valid-Until "false";\n'
            'Acquire::http::Proxy "http://proxy.example:3128";\nAcquire::https::Proxy::deb.example "DIRECT";\n'
            'Dir::Etc::sourcelist "sources.list";\nAcquire::Languages "none";\n')
    assert clean.apt_options(dump) == ['Acquire::Check-Valid-Until "false";',
                                       'Acquire::http::Proxy "http://proxy.example:3128";',
                                       'Acquire::https::Proxy::deb.example "DIRECT";']


def test_only_environment_settings_cross_into_the_root():
    host = {"PIP_INDEX_URL": "https://i.example/simple", "PIP_EXTRA_INDEX_URL": "https://e.example/simple",
            "PIP_FIND_LINKS": "/opt/wheels", "PIP_CERT": "/etc/ssl/c.pem", "SSL_CERT_FILE": "/etc/ssl/c.pem",
            "REQUESTS_CA_BUNDLE": "/etc/ssl/c.pem", "https_proxy": "http://p:3128", "NO_PROXY": "localhost",
            "ONEBIT_DEBIAN_MIRROR": "http://m.example/debian", "PIP_EMPTY": "",
            # the product and the host's own: never
            "ONEBIT_CACHE": "/var/cache/onebit", "PATH": "/usr/bin", "VIRTUAL_ENV": "/venv", "HOME": "/root",
            "CCACHE_DIR": "/ccache", "LD_LIBRARY_PATH": "/opt/lib", "PYTHONPATH": "/src"}
    passed = passthrough.passed_env(host)
    assert set(passed) == {"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CERT", "SSL_CERT_FILE",
                           "REQUESTS_CA_BUNDLE", "https_proxy", "NO_PROXY", "ONEBIT_DEBIAN_MIRROR"}
    kinds = passthrough.setting_kinds(host)
    assert kinds["proxy"] == ["NO_PROXY", "https_proxy"] and kinds["CA bundle"] == ["REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"]
    assert kinds["Debian mirror"] == ["ONEBIT_DEBIAN_MIRROR"]


def test_host_paths_named_by_settings_and_how_they_reach_the_root(tmp_path):
    values = ["/opt/wheels /opt/more", "file:///opt/pypi/simple", "https://user:secret@i.example/simple",
              "/etc/ssl/c.pem", "file:/srv/idx/simple/"]
    assert passthrough.named_paths(values) == ["/opt/wheels", "/opt/more", "/opt/pypi", "/etc/ssl/c.pem", "/srv/idx"]
    files, dirs, in_root = {"/etc/ssl/c.pem", "/etc/pip.conf"}, {"/opt/wheels", "/etc/ssl/certs"}, {"/etc/ssl/certs"}
    c = passthrough.carry(["/etc/ssl/c.pem", "/opt/wheels", "/etc/ssl/certs", "/gone"], is_file=files.__contains__,
                    is_dir=dirs.__contains__, in_root=in_root.__contains__,
                    configs=[("/etc/pip.conf", "/etc/pip.conf"), ("/home/u/.config/pip/pip.conf", "/root/.config/pip/pip.conf")])
    assert c.copy == (("/etc/pip.conf", "/etc/pip.conf"), ("/etc/ssl/c.pem", "/etc/ssl/c.pem"))
    assert c.bind == ("/opt/wheels",) and c.own == ("/etc/ssl/certs",) and c.missing == ("/gone",)


def test_pip_configuration_files_and_their_paths():
    files = passthrough.pip_config_files({"PIP_CONFIG_FILE": "/srv/pip.ini"}, "/home/u")
    assert ("/home/u/.config/pip/pip.conf", "/root/.config/pip/pip.conf") in files
    assert ("/etc/pip.conf", "/etc/pip.conf") in files and files[-1] == ("/srv/pip.ini", "/srv/pip.ini")
    assert passthrough.pip_config_files({"PIP_CONFIG_FILE": os.devnull}, "/h")[-1][0] != os.devnull
    text = "[global]\ncert = /etc/ssl/c.pem\nfind-links = /opt/wheels\ntimeout = 60\n[install]\nindex-url = file:///opt/pypi/simple\n"
    assert sorted(passthrough.pip_config_values(text)) == ["/etc/ssl/c.pem", "/opt/wheels", "file:///opt/pypi/simple"]
    assert passthrough.pip_config_values("not [ini") == []


def test_mmdebstrap_makes_a_minbase_root_with_python3():
    argv = clean.mmdebstrap_argv("trixie", "/r", "http://m.example/debian", ['Acquire::Check-Valid-Until "false";'])
    assert argv == ["mmdebstrap", "--mode=root", "--variant=minbase", "--include=python3,ca-certificates",
                    '--aptopt=Acquire::Check-Valid-Until "false";', "trixie", "/r", "http://m.example/debian"]


def test_summary_line():
    r = fresh.Result("bookworm", [fresh.Step("readme", "x", 0, 400.2), fresh.Step("check", "y", 1, 3.0),
                                  fresh.Step("chat", "z")], seconds=410.0)
    assert not r.ok
    assert fresh.summary(r) == "bookworm   FAILED total 6m50s  readme ok 6m40s  check rc=1 0m03s  chat not run 0m00s"


def test_checkout_copy_is_git_files_only(tmp_path):
    files = checkout.checkout_files(ROOT)
    assert "README.md" in files and "scripts/nox.py" in files
    assert not [f for f in files if f.startswith((".onebit/", ".nox/", ".venv/"))]


def test_a_tar_unpacks_without_pep706_filters(tmp_path):
    """Debian 12's python3 (3.11.2) has no tarfile filters, and the project's one unpacker never uses tarfile's
    extract: the checked members unpack as the 'data' filter would (no setuid bit, owned by whoever unpacks)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("pkg/tool")
        info.size, info.mode, info.uid, info.uname = 3, 0o4777, 4242, "someone"
        tar.addfile(info, io.BytesIO(b"abc"))
    archive = tmp_path / "a.tar"
    archive.write_bytes(buf.getvalue())
    assert archives.extract_tar(archive, tmp_path / "out") == 1
    st = (tmp_path / "out" / "pkg" / "tool").stat()
    assert stat.S_IMODE(st.st_mode) == 0o755 and st.st_uid == os.getuid()


def _bootstrap():
    spec = importlib.util.spec_from_file_location("bootstrap_nox", ROOT / "scripts" / "nox.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("euid, apt_owns, says", [
    (1000, True, "as root, apt-get install python3.{minor}-venv, then run this command again"),
    (0, False, "its venv or ensurepip module is missing"),
    (1000, False, "its venv or ensurepip module is missing"),
])
def test_bootstrap_names_what_to_install_in_one_line(tmp_path, monkeypatch, capsys, euid, apt_owns, says):
    """Where python3 cannot make a virtual environment with pip and apt cannot (or may not) help: one line, exit 2,
    nothing left behind."""
    nox = _bootstrap()
    import subprocess
    import sys
    monkeypatch.setattr(nox, "make_venv", lambda dest: subprocess.CompletedProcess([], 1, "", "ensurepip is not available"))
    monkeypatch.setattr(nox.os, "geteuid", lambda: euid)
    monkeypatch.setattr(nox, "apt_owns_interpreter", lambda: apt_owns)
    monkeypatch.setattr(nox, "install_venv_package", lambda: pytest.fail("apt-get must not run here"))
    with pytest.raises(SystemExit) as exit_:
        nox.build(tmp_path / "venv")
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and says.format(minor=sys.version_info.minor) in err[0]
    assert not (tmp_path / "venv").exists()


def test_bootstrap_installs_the_venv_package_only_as_root_for_apts_python(tmp_path, monkeypatch):
    nox = _bootstrap()
    import subprocess
    asked = []
    results = iter([subprocess.CompletedProcess([], 1, "", "ensurepip"), subprocess.CompletedProcess([], 1, "", "x")])
    monkeypatch.setattr(nox, "make_venv", lambda dest: next(results))
    monkeypatch.setattr(nox.os, "geteuid", lambda: 0)
    monkeypatch.setattr(nox, "apt_owns_interpreter", lambda: True)
    monkeypatch.setattr(nox, "install_venv_package", lambda: asked.append(nox.venv_package()))
    with pytest.raises(SystemExit):
        nox.build(tmp_path / "venv")
    assert asked == [nox.venv_package()] and nox.venv_package().endswith("-venv")


def test_sudo_keeps_only_the_settings_that_cross():
    env = {"PIP_INDEX_URL": "https://i.example/simple", "https_proxy": "http://p:3128", "ONEBIT_CACHE": "/c",
           "PATH": "/usr/bin", "GITHUB_TOKEN": "t"}
    assert fresh.sudo_argv(env, "/opt/py/bin/python", ["bookworm", "--keep"]) == [
        "sudo", "-n", "--preserve-env=PIP_INDEX_URL,https_proxy", "--", "/opt/py/bin/python", "-m", "builders.fresh",
        "bookworm", "--keep"]
    assert fresh.sudo_argv({}, "/py", ["trixie"])[:3] == ["sudo", "-n", "--"]


# ---- the channels step (--channels) ----------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, want", [
    (["bookworm"], dict(suites=["bookworm"], channels=[], channels_only=False)),
    ([], dict(suites=["bookworm", "trixie"], channels=[], channels_only=False)),
    (["--channels", "a", "--channels", "b", "--channels-only", "bookworm", "trixie"],
     dict(suites=["bookworm", "trixie"], channels=["a", "b"], channels_only=True)),
    (["--channels-only", "bookworm"], "--channels-only needs at least one --channels DIR"),
    (["--channels"], "argument --channels: expected one argument (see nox -s fresh -- -h)"),
    (["--nope"], "unrecognized arguments: --nope (see nox -s fresh -- -h)"),
])
def test_arguments(argv, want):
    if isinstance(want, str):
        with pytest.raises(fresh.BadArgs) as exc:
            fresh.parse_args(argv)
        assert str(exc.value) == want
    else:
        a = fresh.parse_args(argv)
        assert {k: getattr(a, k) for k in want} == want


@pytest.mark.parametrize("listing, want", [
    (None, "--channels ch: not a conda channel (no linux-64/repodata.json)"),
    (["onebit-bundle-cpu-2026.49-h1_0.conda"], "--channels ch: not a conda channel (no linux-64/repodata.json)"),
    (["repodata.json", "onebit-cpu-2026.49-default_h0_0.conda"],
     "--channels ch: holds no bundle (no linux-64/onebit-bundle-*.conda)"),
    (["repodata.json", "onebit-bundle-cpu-2026.49-h1_0.conda"], None),
])
def test_a_channel_argument(listing, want):
    assert channels_check.channel_problem("ch", listing) == want


def test_bundles_in_a_channel():
    assert channels_check.bundles_in(["repodata.json", "onebit-bundle-strix-2026.49-habc_0.conda", "onebit-cpu-2026.49-x_0.conda",
                             "onebit-bundle-cpu-2026.49-h1_0.conda", "onebit-bundle-cpu-2026.49-h1_1.conda",
                             "onebit-bundle-nvidia-sm90-2026.49-h2_0.conda"]) == ["cpu", "nvidia-sm90", "strix"]


STATUS = """Package: libc6
Status: install ok installed

Package: libgomp1
Status: deinstall ok config-files

Package: gcc-12
Status: install ok installed
Description: GNU C compiler
 Package: not-a-field
"""


def test_what_of_a_compiler_a_root_holds():
    assert channels_check.installed_packages(STATUS) == {"libc6", "gcc-12"}
    assert channels_check.compiler_found({"libc6", "python3", "libgcc-s1", "libstdc++6"}, []) == []  # minbase + python3
    assert channels_check.compiler_found({"libc6", "gcc-12", "libgomp1", "cpp"}, ["usr/bin/cc"]) == \
        ["usr/bin/cc", "cpp", "gcc-12", "libgomp1"]


LOADER = ("llama-server: error while loading shared libraries: libvulkan.so.1: cannot open shared object file: "
          "No such file or directory")


@pytest.mark.parametrize("rc, output, want", [
    (0, "version: 1 (0c1e570)", True),
    (1, "error: unknown argument: --version", True),  # it ran: its own parser refused the argument
    (None, "", True),  # still running at the timeout: past the loader
    (127, LOADER, False),
    (127, "", False),
    (1, "bwrap: execvp /p/bin/x: No such file or directory", False),  # no interpreter: never executed
])
def test_what_counts_as_started(rc, output, want):
    assert channels_check.started(rc, output) is want


@pytest.mark.parametrize("tried, want", [
    ([], "--version"),
    ([("--version", 0, "v1")], None),
    ([("--version", 1, "unknown argument")], "--help"),
    ([("--version", None, "")], None),
    ([("--version", 127, LOADER)], None),  # the loader refused it: another argument changes nothing
    ([("--version", 1, "x"), ("--help", 1, "y")], None),
])
def test_which_argument_next(tried, want):
    assert channels_check.next_arg(tried) == want


@pytest.mark.parametrize("rc, output, missing, want", [
    (0, "all ok", [], True),
    (1, "cpu FAIL", [], False),
    (0, "ROCm0: cannot run here (libamdhip64.so.7, libhipblas.so.3 missing; provided by ...)",
     ["libamdhip64.so.7", "libhipblas.so.3"], True),
    (0, "ROCm0: cannot run here (libamdhip64.so.7 missing)", ["libamdhip64.so.7", "libhipblas.so.3"], False),
])
def test_a_check_did_its_job(rc, output, missing, want):
    assert channels_check.check_ok(rc, output, missing) is want


def test_host_sets_of_a_manifest():
    doc = {"backends": {"cpu": {}, "vulkan": {"host_libraries": [{"soname": "libvulkan.so.1", "set": "vulkan"}]},
                        "ds4-rocm": {"host_libraries": [{"soname": "libamdhip64.so.7", "set": "rocm7"},
                                                        {"soname": "libhipblas.so.3", "set": "rocm7"}]},
                        "zinc": {"host_libraries": [{"soname": "libvulkan.so.1", "set": "vulkan"}]}}}
    assert list(channels_check.host_sets(doc)) == ["vulkan", "rocm7"]
    assert channels_check.host_sets(doc) == {"vulkan": ("libvulkan.so.1",), "rocm7": ("libamdhip64.so.7", "libhipblas.so.3")}


def test_channels_summary_line():
    from builders.ship.channels_check import ChannelsRun, PrefixRun, Program

    c = ChannelsRun(prefixes=[
        PrefixRun("cpu", [Program("bin/a", "--version", 0, True)] * 3, [("1bit check", True)]),
        PrefixRun("strix", [Program("bin/b", "--help", 0, True), Program("bin/c", "--version", 127)],
                  [("1bit check without the rocm7 stand-ins", True), ("1bit check", True)])], seconds=75.0)
    assert not c.ok
    r = fresh.Result("trixie", channels=c, seconds=200.0)
    assert fresh.summary(r) == ("trixie     FAILED total 3m20s  channels FAILED 75.0s  no cc/gcc/libgomp1  programs 4/5 "
                                "started  checks 3/3 ok  (cpu 3/3, strix 1/2)")
    c.prefixes[1].programs.pop()
    assert c.ok and fresh.Result("trixie", channels=c).ok
    c.compiler = ["gcc-12"]
    assert not c.ok and "compiler present: gcc-12" in channels_check.channels_summary(c)
