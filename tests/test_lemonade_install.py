"""`1bit-build lemonade install` hardened (issue 16): all-or-nothing verification, names that cannot escape, `./`
members, the cache lock under two real concurrent installs, a real kill at every step, bounds, verify by default, and
the `<backend>_bin` pin in Lemonade's own config.json."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from builders.project.config import file_sha256
from builders.errors import OnebitError
from builders.io import swap, tarball
from builders.cli import main
from builders.release import lemonade, lemonade_archives, lemonade_config, lemonade_install

OLD, NEW = "v2026.47", "v2026.48"


NAMES = {"cpu": "llama-{tag}-bin-ubuntu-x64.tar.gz", "vulkan": "llama-{tag}-bin-ubuntu-vulkan-x64.tar.gz"}  # Lemonade's
MiB = 1 << 20


def archive(out: Path, tag: str, files: dict[str, bytes], backend: str = "cpu") -> Path:
    """A Lemonade-named archive with one top folder, written by the project's tar writer."""
    name = NAMES[backend].format(tag=tag)
    top = name.removesuffix(".tar.gz")
    return tarball.write(out / name, top, {rel: tarball.Entry(data=data) for rel, data in files.items()}, mtime=0)


def sums(out: Path, *archives: Path, wrong: Path | None = None) -> Path:
    text = "".join(f"{'0' * 64 if a == wrong else file_sha256(a)}  {a.name}\n" for a in archives)
    (out / "SHA256SUMS").write_text(text)
    return out / "SHA256SUMS"


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def files_of(tag: str, n: int = 3) -> dict[str, bytes]:
    return {"bin/llama-server": f"#!/bin/sh\necho {tag}\n".encode(),
            **{f"lib/lib{tag}-{i:03}.so": f"{tag} {i}\n".encode() * 50 for i in range(n)}}


def installed(files: dict[str, bytes], tag: str) -> dict[str, bytes]:
    return {**files, "version.txt": tag.encode()}


def install(*argv) -> int:
    return main(["lemonade", "install", *map(str, argv)])


@pytest.fixture
def two(tmp_path):
    out = tmp_path / "rel"
    cpu = archive(out, NEW, files_of("cpu"))
    vulkan = archive(out, NEW, files_of("vulkan"), backend="vulkan")
    return out, cpu, vulkan


def test_every_archive_is_verified_before_anything_is_written(tmp_path, two, capsys):
    out, cpu, vulkan = two
    cache = tmp_path / "cache"
    assert install(cpu, vulkan, "--cache", cache, "--sums", sums(out, cpu, vulkan, wrong=vulkan)) == 2
    assert "does not match" in capsys.readouterr().err
    assert not cache.exists()  # not a folder, not a lock, not a config
    # with a previous install in place, it stays whole
    old = archive(tmp_path / "old", OLD, files_of("old"))
    assert install(old, "--cache", cache, "--sums", sums(tmp_path / "old", old)) == 0
    assert install(cpu, vulkan, "--cache", cache, "--sums", sums(out, cpu, vulkan, wrong=vulkan)) == 2
    assert tree(cache / "bin/llamacpp/cpu") == installed(files_of("old"), OLD)
    assert not (cache / "bin/llamacpp/vulkan").exists()


@pytest.mark.parametrize("flag, value", [("--backend", "."), ("--backend", ".."), ("--backend", "a/b"), ("--backend", ""),
                                         ("--backend", "../../escaped"), ("--recipe", ".."), ("--recipe", "a/b"),
                                         ("--recipe", "."), ("--recipe", "")])
def test_names_are_single_path_components(tmp_path, two, flag, value, capsys):
    out, cpu, vulkan = two
    cache = tmp_path / "cache"
    s = sums(out, cpu, vulkan)
    assert install(cpu, vulkan, "--cache", cache, "--sums", s) == 0
    before = {b: tree(cache / "bin/llamacpp" / b) for b in ("cpu", "vulkan")}
    capsys.readouterr()
    assert install(cpu, "--cache", cache, "--sums", s, flag, value) == 2
    err = capsys.readouterr().err
    assert "not a single folder name" in err and "Traceback" not in err and repr(value) in err
    assert {b: tree(cache / "bin/llamacpp" / b) for b in ("cpu", "vulkan")} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "rel"]  # nothing beside the cache
    assert sorted(p.name for p in (cache / "bin").iterdir()) == ["llamacpp"]


def test_dot_slash_members_from_tar_c_dir_dot(tmp_path):
    """`tar czf X -C dir .` names members ./bin/...: Lemonade strips the shared `.` folder, and so do we."""
    src = tmp_path / "src"
    for rel, data in files_of("dot").items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    arc = tmp_path / f"llama-{NEW}-bin-ubuntu-x64.tar.gz"
    subprocess.run(["tar", "czf", arc, "-C", src, "."], check=True)
    with tarfile.open(arc) as tar:
        assert "./bin/llama-server" in tar.getnames()
    cache = tmp_path / "cache"
    assert install(arc, "--cache", cache, "--sums", sums(tmp_path, arc)) == 0
    assert tree(cache / "bin/llamacpp/cpu") == installed(files_of("dot"), NEW)


def _install_in_child(barrier, argv: list[str]) -> None:
    barrier.wait()
    code = main(argv)
    sys.stderr.flush()
    os._exit(code)


def two_builds(out: Path, a: str, b: str, n: int):
    """Two builds of one backend (OLD and NEW, n files each, told apart by a and b) in out, with their SHA256SUMS:
    (the files of each, the two archives, the sums file)."""
    a_files, b_files = files_of(a, n), files_of(b, n)
    a_archive, b_archive = archive(out, OLD, a_files), archive(out, NEW, b_files)
    return a_files, b_files, a_archive, b_archive, sums(out, a_archive, b_archive)


def test_two_installs_at_once_never_mix(tmp_path):
    """Two real processes install two builds of one backend into one cache at the same moment, 12 times: each
    result is one of them, whole; none of them fails."""
    a_files, b_files, a, b, s = two_builds(tmp_path / "rel", "aaa", "bbb", 150)
    cache = tmp_path / "cache"
    ctx = multiprocessing.get_context("fork")
    seen = set()
    for _ in range(12):
        barrier = ctx.Barrier(2)
        procs = [ctx.Process(target=_install_in_child,
                             args=(barrier, ["lemonade", "install", str(x), "--cache", str(cache), "--sums", str(s)]))
                 for x in (a, b)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0]
        got = tree(cache / "bin/llamacpp/cpu")
        assert got in (installed(a_files, OLD), installed(b_files, NEW))
        seen.add(got["version.txt"])
        assert sorted(p.name for p in (cache / "bin/llamacpp").iterdir()) == ["cpu"]
        config = json.loads((cache / "config.json").read_text())
        assert config["llamacpp"]["cpu_bin"] == got["version.txt"].decode()  # the pin names what is installed


def _killed_after(k: int, argv: list[str]) -> None:
    """Run the install, and die (no cleanup, no finally: os._exit) right after its k-th rename, swap or removal."""
    count = [0]

    def after(fn):
        def step(*a, **kw):
            result = fn(*a, **kw)
            count[0] += 1
            if count[0] == k:
                os._exit(99)
            return result
        return step

    os.rename, os.replace, shutil.rmtree = after(os.rename), after(os.replace), after(shutil.rmtree)
    swap._exchange = after(swap._exchange)
    os._exit(main(argv))


def test_a_kill_at_any_step_leaves_the_old_or_the_new_install(tmp_path):
    old_files, new_files, old, new, s = two_builds(tmp_path / "rel", "old", "new", 20)
    cache = tmp_path / "cache"
    ctx = multiprocessing.get_context("fork")
    kills = 0
    for k in range(1, 60):
        assert install(old, "--cache", cache, "--sums", s) == 0
        p = ctx.Process(target=_killed_after, args=(k, ["lemonade", "install", str(new), "--cache", str(cache),
                                                        "--sums", str(s)]))
        p.start()
        p.join(60)
        got = tree(cache / "bin/llamacpp/cpu") if (cache / "bin/llamacpp/cpu").is_dir() else None
        assert got in (installed(old_files, OLD), installed(new_files, NEW)), f"killed after step {k}"
        if p.exitcode == 0:  # it finished before step k: every step has been tried
            assert got == installed(new_files, NEW)
            break
        assert p.exitcode == 99
        kills += 1
    else:
        pytest.fail("the install never finished")
    assert kills >= 3
    assert install(old, "--cache", cache, "--sums", s) == 0  # what a kill left aside is cleared by the next install
    assert sorted(p.name for p in (cache / "bin/llamacpp").iterdir()) == ["cpu"]


def _zeros_archive(path: Path, top: str, size: int) -> Path:
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        server = b"#!/bin/sh\n"
        ti = tarfile.TarInfo(f"{top}/bin/llama-server")
        ti.size = len(server)
        tar.addfile(ti, io.BytesIO(server))
        ti = tarfile.TarInfo(f"{top}/lib/zeros.bin")
        ti.size = size

        class Zeros:
            left = size

            def read(self, n: int) -> bytes:
                n = min(n, self.left)
                self.left -= n
                return bytes(n)

        tar.addfile(ti, Zeros())
    return path


def test_an_archive_that_unpacks_past_the_bound_is_refused_before_writing(tmp_path, capsys):
    name = f"llama-{NEW}-bin-ubuntu-x64.tar.gz"
    bomb = _zeros_archive(tmp_path / name, name.removesuffix(".tar.gz"), 300 * MiB)
    assert bomb.stat().st_size < 2 * MiB
    cache = tmp_path / "cache"
    assert install(bomb, "--cache", cache, "--sums", sums(tmp_path, bomb)) == 2
    err = capsys.readouterr().err
    assert "unpacks to more than 268,435,456 bytes" in err and "nothing was installed" in err
    assert not cache.exists()


def test_an_archive_with_too_many_members_is_refused(tmp_path, capsys):
    files = {"bin/llama-server": b"x", **{f"d/{i}": b"" for i in range(20_000)}}  # + bin, d, the top: over 20,000
    arc = archive(tmp_path, NEW, files)
    cache = tmp_path / "cache"
    assert install(arc, "--cache", cache, "--sums", sums(tmp_path, arc)) == 2
    assert "more than 20,000 members" in capsys.readouterr().err
    assert not cache.exists()


def test_the_bound_is_stated_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["lemonade", "install", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "20,000 members" in text and "256 MiB" in text and "16 GiB" in text and "50 x" in text


def test_verify_is_the_default(tmp_path, capsys):
    arc = archive(tmp_path, NEW, files_of("v"))
    cache = tmp_path / "cache"
    assert install(arc, "--cache", cache) == 2
    err = capsys.readouterr().err
    assert "nothing to verify the archives against" in err and "--no-verify" in err and len(err.strip().splitlines()) == 2
    assert not cache.exists()
    assert install(arc, "--cache", cache, "--no-verify") == 0
    assert tree(cache / "bin/llamacpp/cpu") == installed(files_of("v"), NEW)


LEMONADE_CONFIG = """{
  "config_version": 2,
  "ctx_size": -1,
  "extra_models_dir": "",
  "host": "localhost",
  "llamacpp": {
    "args": "",
    "backend": "auto",
    "cpu_bin": "builtin",
    "prefer_system": true,
    "vulkan_bin": "latest"
  },
  "log_level": "info",
  "models_dir": "auto",
  "port": 13305,
  "whispercpp": {
    "cpu_bin": "builtin"
  }
}
"""


def test_the_installed_tag_is_pinned_in_lemonades_config(tmp_path, two):
    out, cpu, vulkan = two
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "config.json").write_text(LEMONADE_CONFIG)
    assert install(cpu, vulkan, "--cache", cache, "--fragment", _fragment(out, cpu, vulkan)) == 0
    text = (cache / "config.json").read_text()
    assert text == LEMONADE_CONFIG.replace('"cpu_bin": "builtin",\n    "prefer', f'"cpu_bin": "{NEW}",\n    "prefer') \
        .replace('"vulkan_bin": "latest"', f'"vulkan_bin": "{NEW}"')
    # another config folder, and --no-pin
    conf = tmp_path / "conf"
    assert install(cpu, "--cache", cache, "--config", conf, "--sums", sums(out, cpu, vulkan)) == 0
    assert json.loads((conf / "config.json").read_text()) == {"llamacpp": {"cpu_bin": NEW}}
    assert (conf / "config.json").read_text() == '{\n  "llamacpp": {\n    "cpu_bin": "v2026.48"\n  }\n}\n'
    assert install(cpu, "--cache", tmp_path / "c2", "--no-pin", "--sums", sums(out, cpu, vulkan)) == 0
    assert not (tmp_path / "c2/config.json").exists()


def test_a_broken_config_is_refused_before_anything_is_swapped(tmp_path, two, capsys):
    out, cpu, vulkan = two
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "config.json").write_text('{\n  "llamacpp": {\n    "cpu_bin": oops\n  }\n}\n')
    assert install(cpu, "--cache", cache, "--sums", sums(out, cpu, vulkan)) == 2
    err = capsys.readouterr().err
    assert "config.json:3" in err and "not JSON" in err
    assert (cache / "config.json").read_text().count("oops") == 1


def _fragment(out: Path, *archives: Path) -> Path:
    frag = lemonade_archives.fragment(lemonade.Settings(repos={"cpu": "o/r", "vulkan": "o/r"}), NEW, archives)
    (out / "backend_versions.json").write_text(json.dumps(frag))
    return out / "backend_versions.json"


def test_what_is_unpacked_is_what_was_verified(tmp_path, monkeypatch):
    """An archive swapped for another between the check and the unpack is refused: the unpack hashes what it reads."""
    out = tmp_path / "rel"
    good = archive(out, NEW, files_of("good"))
    checked = lemonade_install.check(good, sha=file_sha256(good))
    evil = archive(tmp_path / "evil", NEW, files_of("evil"))
    shutil.copyfile(evil, good)
    with pytest.raises(OnebitError, match="changed while it was being installed"):
        lemonade_install.install_all([checked], tmp_path / "cache")
    assert not (tmp_path / "cache/bin/llamacpp/cpu").exists()
    assert sorted(p.name for p in (tmp_path / "cache/bin/llamacpp").iterdir()) == []
    assert hashlib.sha256(good.read_bytes()).hexdigest() != checked.sha


# Lemonade strips one folder only when every member lies under one shared top folder that holds nested members
# (its compute_tarball_strip_components, fed `tar -tf`); `./` is such a folder.
@pytest.mark.parametrize("listing, strip", [
    (["top/", "top/bin/", "top/bin/llama-server"], 1),
    (["top/bin/llama-server", "top/lib/x.so"], 1),
    (["./", "./bin/", "./bin/llama-server"], 1),
    (["./bin/llama-server"], 1),
    (["bin/llama-server", "lib/x.so"], 0),
    (["bin/", "bin/llama-server", "lib/"], 0),
    (["top/"], 0),
    (["llama-server"], 0),
    (["top/bin/llama-server", "README"], 0),
    (["top/", "other/"], 0),
])
def test_strip_components(listing, strip):
    assert lemonade_install.strip_components((n, n.endswith("/")) for n in listing) == strip


@pytest.mark.parametrize("layout", ["top", "dot", "flat"])
def test_the_install_lands_where_gnu_tar_puts_it(tmp_path, layout):
    """Lemonade unpacks with `tar -xf A -C DIR --strip-components=N`: our install holds the same files (plus
    version.txt), for an archive with one top folder, one made with `-C dir .`, and one with no top folder."""
    src = tmp_path / "src" / "llama"
    for rel, data in files_of(layout).items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    arc = tmp_path / f"llama-{NEW}-bin-ubuntu-x64.tar.gz"
    where, what = {"top": (src.parent, ["llama"]), "dot": (src, ["."]), "flat": (src, ["bin", "lib"])}[layout]
    subprocess.run(["tar", "czf", arc, "-C", where, *what], check=True)
    listing = subprocess.run(["tar", "-tf", arc], check=True, capture_output=True, text=True).stdout.split()
    strip = lemonade_install.strip_components((n, n.endswith("/")) for n in listing)
    by_tar = tmp_path / "by-tar"
    by_tar.mkdir()
    subprocess.run(["tar", "-xf", arc, "-C", by_tar, f"--strip-components={strip}", "--no-same-owner"], check=True)
    cache = tmp_path / "cache"
    assert install(arc, "--cache", cache, "--no-verify") == 0
    assert tree(cache / "bin/llamacpp/cpu") == {**tree(by_tar), "version.txt": NEW.encode()}
    assert tree(by_tar) == files_of(layout)


@pytest.mark.parametrize("env, cache, expected", [
    ({"STATE_DIRECTORY": "/s", "XDG_CONFIG_HOME": "/x", "HOME": "/h"}, None, "/s"),
    ({"XDG_CONFIG_HOME": "/x", "HOME": "/h"}, None, "/x/lemonade"),
    ({"HOME": "/h", "LEMONADE_CACHE_DIR": "/c"}, None, "/h/.config/lemonade"),  # the cache variable moves no config
    ({"STATE_DIRECTORY": "/s", "HOME": "/h"}, "/c", "/c"),  # `lemond /c`: a cache folder and no config folder
])
def test_config_dir(env, cache, expected):
    assert lemonade_config.config_dir(env, cache=Path(cache) if cache else None) == Path(expected)


PIN = {("llamacpp", "cpu_bin"): "v2026.48"}


@pytest.mark.parametrize("before, after", [
    (None, '{\n  "llamacpp": {\n    "cpu_bin": "v2026.48"\n  }\n}\n'),
    ("", '{\n  "llamacpp": {\n    "cpu_bin": "v2026.48"\n  }\n}\n'),
    ('{\n  "a": 1.5,\n  "llamacpp": {\n    "cpu_bin": "builtin"\n  },\n  "z": ["ü", [], {}]\n}\n',
     '{\n  "a": 1.5,\n  "llamacpp": {\n    "cpu_bin": "v2026.48"\n  },\n  "z": [\n    "ü",\n    [],\n    {}\n  ]\n}\n'),
    ('{\n\t"port": 8000\n}', '{\n\t"port": 8000,\n\t"llamacpp": {\n\t\t"cpu_bin": "v2026.48"\n\t}\n}'),
    ('{"port":8000}\n', '{"port":8000,"llamacpp":{"cpu_bin":"v2026.48"}}\n'),
    ('{"port": 8000}', '{"port": 8000, "llamacpp": {"cpu_bin": "v2026.48"}}'),
])
def test_with_pins_keeps_the_files_format(before, after):
    assert lemonade_config.with_pins(before, PIN) == after
    assert lemonade_config.with_pins(after, PIN) == after


@pytest.mark.parametrize("text, match", [
    ('{\n  "llamacpp": "cpu"\n}\n', "'llamacpp' is not an object"),
    ("[1, 2]\n", "is not a JSON object"),
    ('{\n  "a": 1,\n  oops\n}\n', r"config.json:3: not JSON"),
    ('{"ctx_size": 1e400}', r"holds the number 1e400 \(out of a double's range\), which JSON cannot carry"),
    ('{"ctx_size": -1e400}', r"holds the number -1e400"),
    ('{"a": NaN}', "holds NaN, which JSON cannot carry"),
    ('{"a": [Infinity]}', "holds Infinity"),
    ('{"a": "\\ud800"}', r"holds a lone surrogate \(\\ud800\)"),
    ('{"\\udfff": 1}', r"holds a lone surrogate \(\\udfff\)"),
])
def test_with_pins_refuses(text, match):
    with pytest.raises(OnebitError, match=match):
        lemonade_config.with_pins(text, PIN)


@pytest.mark.parametrize("text", ['{"ctx_size": 1e400}\n', '{"name": "\\ud800"}\n', b'{"a": "\xff"}\n'])
def test_a_config_json_cannot_carry_is_refused_before_anything_is_swapped(tmp_path, two, capsys, text):
    out, cpu, vulkan = two
    cache = tmp_path / "cache"
    cache.mkdir()
    conf = cache / "config.json"
    conf.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = conf.read_bytes()
    assert install(cpu, "--cache", cache, "--sums", sums(out, cpu, vulkan)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "nothing was changed" in err and len(err.strip().splitlines()) <= 2
    assert conf.read_bytes() == before
    assert sorted(p.name for p in cache.rglob("*") if not p.name.endswith(".lock")) == ["config.json"]  # nothing swapped


def test_a_linked_config_json_is_written_through_to_its_target(tmp_path, two, capsys):
    out, cpu, vulkan = two
    cache = tmp_path / "cache"
    cache.mkdir()
    real = tmp_path / "dotfiles" / "lemonade.json"
    real.parent.mkdir()
    real.write_text('{\n  "port": 8000\n}\n')
    (cache / "config.json").symlink_to(os.path.relpath(real, cache))
    assert install(cpu, "--cache", cache, "--sums", sums(out, cpu, vulkan)) == 0
    assert (cache / "config.json").is_symlink()
    assert json.loads(real.read_text()) == {"port": 8000, "llamacpp": {"cpu_bin": NEW}}
    assert sorted(p.name for p in real.parent.iterdir() if not p.name.endswith(".lock")) == ["lemonade.json"]
    real.unlink()  # a link to nothing: refused in one line, nothing swapped
    assert install(vulkan, "--cache", cache, "--sums", sums(out, cpu, vulkan)) == 2
    assert "which does not exist; nothing was changed" in capsys.readouterr().err
    assert not (cache / "bin" / "llamacpp" / "vulkan").exists()


def test_installs_into_two_caches_sharing_one_config_keep_both_pins(tmp_path, two):
    """The config's own lock: while it is held, an install into another cache waits for it (say() tells), then
    re-reads the config, so the pin of the other install is kept."""
    import threading

    from builders.io import lock

    out, cpu, vulkan = two
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "config.json").write_text('{"llamacpp": {"cpu_bin": "builtin"}}\n')
    waiting = threading.Event()
    done: list = []

    def second():
        checked = lemonade_install.check(vulkan, sha=file_sha256(vulkan))
        done.append(lemonade_install.install_all([checked], tmp_path / "cache2", config=conf,
                                         say=lambda m: waiting.set() if "waiting for" in m else None))

    with lock.hold(conf / "config.json", "Lemonade config"):  # the lock beside the file: config.json.lock
        t = threading.Thread(target=second)
        t.start()
        while t.is_alive() and not waiting.is_set():
            waiting.wait(0.05)
        assert waiting.is_set()  # the second install waits for the config, although its cache is another one
        first = lemonade_install.check(cpu, sha=file_sha256(cpu))
        # as the first install does
        lemonade_config.record_pins(conf, {lemonade_config.bin_key(first.recipe, first.backend): first.tag})
    t.join()
    assert done and json.loads((conf / "config.json").read_text()) == {"llamacpp": {"cpu_bin": NEW, "vulkan_bin": NEW}}
