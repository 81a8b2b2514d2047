"""Execute a plan: run each step's commands, skip steps whose cache key was already built, show progress."""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from . import (bundle, companions, elf, fetch, gitcmd, manifest, package, patch, runner, stage, swap, toolchain,
               toolchain_record)
from .config import Project
from .errors import BuildError, OnebitError, StageError
from .kinds import KINDS
from .plan import clobbers, may_lack_under
from .session import log_to, new_console
from .plan_types import (BuildData, Command, CratesData, FetchData, HfData, PackageData, Plan, RootData, SourceData,
                         StageData, Step, SubmodulesData, ToolchainData, WheelsData)
from . import licenses
from .stage import KEY_FILE

_NINJA = re.compile(r"^\[(\d+)/(\d+)\]")
_LINES = re.compile(r".*\n|.+\Z")  # an output's lines, each with its newline
PLAIN_PROGRESS_EVERY = 30.0  # seconds between plain progress lines when the output is not a terminal


def progress_every() -> float:
    """Seconds between plain progress lines off a terminal: $ONEBIT_PROGRESS_EVERY, else PLAIN_PROGRESS_EVERY."""
    try:
        return max(0.0, float(os.environ["ONEBIT_PROGRESS_EVERY"]))
    except (KeyError, ValueError):
        return PLAIN_PROGRESS_EVERY


@dataclass
class Report:
    ran: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


class Executor:
    def __init__(self, plan: Plan, project: Project, *, offline: bool = False, force: bool = False,
                 console: Console | None = None):
        self.plan = plan
        self.project = project
        self.offline = offline
        self.force = force
        self.console = console or new_console()
        self.log = log_to(self.console)
        self.layout = plan.layout
        self.report = Report()
        self.log_dir = self.layout.work / "logs"

    # ---- cache: a step is reused only when its stamp exists AND its output says it holds that key ------------------
    def _bundle_done(self) -> bool:
        key_file = self.layout.out / KEY_FILE
        publish = next((s for s in self.plan.steps if s.action == "publish"), None)
        return publish is not None and _holds(key_file, publish.key)

    def _outputs_hold(self, step: Step) -> bool:
        d = step.data
        if isinstance(d, FetchData):
            return fetch.cached(Path(d.dest), d.commit, d.may_lack)
        # a cache entry with a marker is reused only when it is trusted: its marker names its key, its record agrees
        if isinstance(d, WheelsData):
            return fetch.wheels_untrusted(Path(d.dir), d.requirements, d.pythons) is None
        if isinstance(d, ToolchainData):
            return toolchain.untrusted(Path(d.dest), d.wheels, d.debs) is None
        if isinstance(d, RootData):
            from . import roots

            return roots.untrusted(Path(d.dest), d.key) is None
        if isinstance(d, SubmodulesData):
            subs, _ = companions.read_lock(Path(d.lock), companions.lock_key(d.commit, list(d.want)))
            return subs is not None
        if isinstance(d, CratesData):
            return companions.crates_ready(Path(d.dir))
        if isinstance(d, HfData):
            return companions.hf_ready(Path(d.dir), dict(d.files))
        if isinstance(d, SourceData):
            return _holds(source_key_file(Path(d.dir)), step.key) and Path(d.dir).is_dir()
        if isinstance(d, BuildData):
            return _holds(Path(d.build_dir) / KEY_FILE, step.key)
        if isinstance(d, StageData):
            return _holds(Path(d.stage_root) / KEY_FILE, step.key)
        if isinstance(d, PackageData):
            return d.file.is_file()  # its directory is named by the key
        return False

    def is_cached(self, step: Step) -> bool:
        if self.force:
            return False
        if step.action in BUNDLE_ACTIONS:
            return self._bundle_done()
        return self.layout.step_stamp(step.key).is_file() and self._outputs_hold(step)

    def _stamp(self, step: Step) -> None:
        if step.action in BUNDLE_ACTIONS:
            return
        swap.write_text_atomic(self.layout.step_stamp(step.key), json.dumps({"id": step.id, "key": step.key, "time": time.time()}))

    # ---- running -----------------------------------------------------------------------------------------------
    def run(self) -> Report:
        unknown = sorted({s.action for s in self.plan.steps} - set(ACTIONS))
        if unknown:
            raise BuildError(f"no executor for step action(s) {', '.join(unknown)}", hint="a planner and ACTIONS disagree")
        live = self.console.is_terminal  # off a terminal: one line per step and plain progress lines, no live bars
        with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=self.console, transient=False, disable=not live) as progress:
            overall = progress.add_task(f"{self.plan.bundle}: {len(self.plan.steps)} steps", total=len(self.plan.steps))
            for i, step in enumerate(self.plan.steps, 1):
                if self.is_cached(step):
                    self.report.cached.append(step.id)
                    progress.advance(overall)
                    continue
                if not live:
                    self.log(f"step {i}/{len(self.plan.steps)} {step.id}: {step.title}")
                task = progress.add_task(step.title, total=None)
                started = time.monotonic()
                try:
                    ACTIONS[step.action](self, step, progress, task)
                except OnebitError as exc:
                    raise exc.for_bundle(self.plan.bundle)
                self._stamp(step)
                self.report.seconds[step.id] = time.monotonic() - started
                self.report.ran.append(step.id)
                progress.update(task, total=1, completed=1)
                progress.advance(overall)
        return self.report

    def _run_commands(self, step: Step, commands, progress: Progress, task, *, checker: Callable | None = None,
                      noter: Callable | None = None) -> dict:
        """Run the commands, logging to work/logs/<step>.log; checker(i, output) may fail the step, noter(i, output)
        may inform (a log line, and facts the manifest records). Returns the facts."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / (step.id.replace(":", "-").replace("/", "_") + ".log")
        facts: dict = {}
        with open(log_path, "w") as log:
            for i, cmd in enumerate(commands):
                output = self._run_one(cmd, log, progress, task, label=step.id)
                problem = checker(i, output) if checker else None
                if problem:
                    raise BuildError(problem, where=getattr(step.data, "where", step.id), hint=f"full log: {log_path}")
                if noter:
                    note, more = noter(i, output)
                    if note:
                        self.log(f"[yellow]{step.id}[/]: {note}")
                        log.write(f"# onebit: {note}\n")
                    facts.update(more)
        return facts

    def _run_one(self, cmd: Command, log, progress: Progress, task, label: str = "") -> str:
        env = cmd.environ(os.environ)
        argv = list(cmd.argv)
        if argv[:1] == ["git"]:  # every git call hardened the one way (builders/gitcmd.py), with its deadline
            gitcmd.refuse_special_files(argv[1:], cmd.cwd)
            argv, env = gitcmd.bounded_argv(argv[1:]), gitcmd.env(base=env)
        for d in cmd.mkdirs:
            Path(d).mkdir(parents=True, exist_ok=True)
        for path, text in cmd.files:  # what the command reads that the plan wrote (a CMake toolchain file)
            swap.write_text_atomic(Path(path), text)
            log.write(f"# onebit: wrote {path}\n")
        for path, target in cmd.links:  # link names the command links against (the user's ROCm in a build root)
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            if Path(path).is_symlink() or Path(path).exists():
                Path(path).unlink()
            os.symlink(target, path)
        log.write(f"$ {cmd.shell()}\n")
        log.flush()
        started = time.monotonic()
        last = [started]
        every = progress_every()

        def on_line(line: str) -> None:
            m = _NINJA.match(line)
            if m:
                progress.update(task, completed=int(m.group(1)), total=int(m.group(2)))
                log.flush()  # so `tail -f` on the log follows the build
            now = time.monotonic()
            if not self.console.is_terminal and now - last[0] >= every:
                # CI logs: a plain line about every 30 s, since the live bar only draws on a terminal
                last[0] = now
                done = f" [{m.group(1)}/{m.group(2)}]" if m else ""
                self.console.print(f"... {label or cmd.argv[0]}{done} {int(now - started)} s", highlight=False, markup=False,
                                   soft_wrap=True)

        try:
            proc = runner.tee(argv, log=log, on_line=on_line, cwd=cmd.cwd, env=env)
        except FileNotFoundError:
            raise BuildError(f"command not found: {cmd.argv[0]}", hint="install it, or check the recipe's toolchain") from None
        if proc.returncode != 0:
            tail = "".join(_LINES.findall(proc.stdout)[-25:])
            raise BuildError(f"command failed (exit {proc.returncode}): {cmd.shell()}\n{tail}", hint=f"full log: {log.name}")
        return proc.stdout

    # ---- actions -----------------------------------------------------------------------------------------------
    def do_fetch(self, step: Step, progress, task) -> None:
        pin = self.project.pins[step.data.pin]
        how = fetch.fetch_pin(pin, Path(step.data.dest), self.layout.downloads(), offline=self.offline,
                              log=lambda m: progress.update(task, description=f"{step.title}: {m}"),
                              mirror_dirs=fetch.mirror_dirs(self.layout.mirror_dirs, os.environ),
                              may_lack=step.data.may_lack)
        self.log(f"fetched {pin.name} @ {pin.short} from {how}")

    def do_wheels(self, step: Step, progress, task) -> None:
        fetch.fetch_wheels(list(step.data.requirements), Path(step.data.dir), list(step.data.pythons), offline=self.offline,
                           log=lambda m: progress.update(task, description=f"{step.title}: {m}"))

    def do_toolchain(self, step: Step, progress, task) -> None:
        d: ToolchainData = step.data
        how = toolchain.fetch_and_assemble(d.wheels, self.layout.downloads(), Path(d.dest), offline=self.offline,
                                           log=lambda m: progress.update(task, description=f"{step.title}: {m}"),
                                           debs=d.debs, floor=(d.floor[0], dict(d.floor[1])) if d.floor else None)
        inputs = [w.requirement for w in d.wheels] + [x.name for x in d.debs]
        self.log(f"{d.tool}: {', '.join(inputs)}: {how}")

    def do_root(self, step: Step, progress, task) -> None:
        from . import roots

        d: RootData = step.data
        pin = self.project.roots[d.name]
        how = roots.assemble(pin, self.layout.downloads(), Path(d.dest), offline=self.offline,
                             log=lambda m: progress.update(task, description=f"{step.title}: {m}"))
        self.log(f"build root {d.name} ({d.key[:16]}): {how}")

    def do_submodules(self, step: Step, progress, task) -> None:
        d: SubmodulesData = step.data
        subs = companions.fetch_submodules(self.layout.git_cache, Path(d.git_dir), d.commit, d.url, list(d.want),
                                           Path(d.lock), offline=self.offline,
                                           log=lambda m: progress.update(task, description=f"{step.title}: {m}"))
        self.log(f"submodules of {d.pin}: " + ", ".join(f"{s.path} @ {s.commit[:7]}" for s in subs))

    def do_crates(self, step: Step, progress, task) -> None:
        d: CratesData = step.data
        how = companions.vendor_crates(Path(d.source), d.manifest, Path(d.dir), offline=self.offline,
                                       root=d.root.dir if d.root else None)
        self.log(f"crates of {d.manifest}: {how}")

    def do_hf(self, step: Step, progress, task) -> None:
        d: HfData = step.data
        how = companions.fetch_hf(d.repo, d.revision, dict(d.files), Path(d.dir), where=d.where, offline=self.offline,
                                  log=lambda m: progress.update(task, description=f"{step.title}: {m}"))
        self.log(f"{d.repo} @ {d.revision[:7]}: {how}")

    def do_source(self, step: Step, progress, task) -> None:
        d: SourceData = step.data
        src = Path(d.dir)
        key_file = source_key_file(src)
        key_file.unlink(missing_ok=True)
        if patch.reset_checkout(src, d.commit, [(e.into, e.commit) for e in d.extra]):
            self.log(f"reset {src.name} to {d.commit[:7]} (its patches changed)")
        else:
            shutil.rmtree(src, ignore_errors=True)
            for cache_dir in {c.argv[2] for c in step.commands if c.argv[1:2] == ("--git-dir",)}:
                gitcmd.run(["--git-dir", cache_dir, "worktree", "prune"])
            self._run_commands(step, self._checkout_commands(step), progress, task)
        if d.submodules_lock:
            companions.checkout_submodules(src, Path(d.submodules_lock), self.layout.git_cache)
        results = patch.apply_all(src, [Path(p) for p in d.patches], where=d.where)
        for r in results:
            self.log(f"patch {r.patch}: {r.status}{' ' + r.detail if r.detail else ''}")
        swap.write_text_atomic(key_file, step.key + "\n")

    def _checkout_commands(self, step: Step) -> list[Command]:
        """The plan's worktree commands, as sparse checkouts where a cache entry lacks files (a partial clone's): each
        absent file checked against the recipe's source.may_lack (one line naming the first that is not), listed
        in the log and beside the checkout (<src>.onebit-absent)."""
        d: SourceData = step.data
        out: list[Command] = []
        listed: list[str] = []
        for c in step.commands:
            if "apply" in c.argv:
                continue
            if c.argv[1:2] != ("--git-dir",) or "worktree" not in c.argv:
                out.append(c)
                continue
            cache_dir, dest, commit = c.argv[2], c.argv[-2], c.argv[-1]
            absent = [p for p, _ in fetch.absent_files(Path(cache_dir))]
            into = os.path.relpath(dest, d.dir)
            globs = d.may_lack if into == "." else may_lack_under(d.may_lack, into)
            bad = fetch.untolerated(absent, [(d.where, globs)])
            if bad:
                raise BuildError(f"the cache entry of {commit[:7]} ({cache_dir}) lacks {bad[0][0]}, which this recipe "
                                 "may use (no glob of its source.may_lack matches it)", where=d.where,
                                 hint="fetch the commit from a complete mirror (delete that cache entry first), or add "
                                      "the path to source.may_lack if the build never reads it")
            listed += [p if into == "." else f"{into}/{p}" for p in absent]
            out += [Command(argv) for argv in fetch.worktree_commands(cache_dir, dest, commit, absent)]
        marker = Path(d.dir).with_name(Path(d.dir).name + fetch.ABSENT_FILE)
        if listed:
            swap.write_text_atomic(marker, "".join(f"{p}\n" for p in listed))
            self.log(f"{step.id}: {len(listed)} file(s) of the pinned tree are absent from the checkout (its mirror is a "
                     f"partial clone; tolerated by source.may_lack), listed in {marker}: {', '.join(listed)}")
        else:
            marker.unlink(missing_ok=True)
        return out

    def do_build(self, step: Step, progress, task) -> None:
        d: BuildData = step.data
        build_dir = Path(d.build_dir)
        (build_dir / KEY_FILE).unlink(missing_ok=True)
        (build_dir / stage.OFFLOAD_NOTES).unlink(missing_ok=True)  # the next stage lists the new build's targets
        source_file, flags_file = build_dir / ".onebit-source", build_dir / ".onebit-flags"
        configured = _cmake_home(build_dir)
        used = build_dir.is_dir() and any(build_dir.iterdir())
        stale = (used and not (_holds(source_file, d.source_dir) and _holds(flags_file, d.flags))) or (
            configured is not None and configured != d.source_dir)
        if d.fresh_dir or stale:
            # configured against another checkout or with other path maps (CMake reads CFLAGS only when it first
            # configures), or by a builder that did not record which: start clean
            shutil.rmtree(build_dir, ignore_errors=True)
        build_dir.mkdir(parents=True, exist_ok=True)
        source_file.write_text(d.source_dir + "\n")
        flags_file.write_text(d.flags + "\n")
        kind = KINDS[d.kind]
        if not d.network_isolated:
            self.log(f"[yellow]network not isolated[/] for {d.variant}: this host cannot cut it (unshare --net "
                             "is unavailable or refused); the manifest records `build_network: not isolated`")
        facts = self._run_commands(step, step.commands, progress, task, checker=getattr(kind, "check_output", None),
                                   noter=getattr(kind, "note_output", None))
        swap.write_text_atomic(build_dir / NOTES_FILE, json.dumps(facts, sort_keys=True))
        (build_dir / KEY_FILE).write_text(step.key + "\n")

    def do_stage(self, step: Step, progress, task) -> None:
        from .repro import wheel_members

        # the vendored wheels, one folder per CPython (cp311/, ...)
        vendored = wheel_members(d for s in self.plan.steps if s.action == "wheels" for d in sorted(Path(s.data.dir).glob("cp*")))
        stage.stage_variant(step.data, self.layout.work, step.key, cache=self.layout.cache, vendored=vendored,
                            run_install=lambda: self._run_commands(step, step.commands, progress, task),
                            log=self.log)

    def do_package(self, step: Step, progress, task) -> None:
        d: PackageData = step.data
        depends = list(d.depends)
        if d.glibc_floor and elf.any_elf(Path(d.prefix)):
            depends.append(f"__glibc >={d.glibc_floor}")
        package.assemble(name=d.name, version=d.version, build_string=d.build_string, build_number=d.build_number,
                         files_dir=Path(d.prefix), out_dir=Path(d.out), platform=self.plan.platform, license=d.license,
                         summary=d.summary, homepage=d.homepage, depends=depends,
                         license_files=licenses.package_license_files(self.plan, step, self.layout.root))

    def _package_steps(self) -> list[Step]:
        return [s for s in self.plan.steps if s.action == "package"]

    def _manifest(self) -> dict:
        """The plan's entries, plus what each build reported about itself (dropped shader features)."""
        entries = [(s.data.backend, {**s.data.manifest_entry, **_notes(Path(s.data.build_dir))}) for s in self.plan.steps
                   if s.action == "stage" and s.data.manifest_entry]
        return manifest.make_manifest(self.plan.bundle, self.plan.version, self.plan.build_number, self.plan.platform, entries)

    def _meta_file(self) -> Path:
        meta = self.plan.step("bundle:metapackage")
        return Path(meta.data.out) / package.conda_filename(meta.data.name, self.plan.version, self._meta_build_string())

    def _meta_depends(self) -> list[str]:
        return [bundle.pin_spec(s.data.name, s.data.version, s.data.build_string) for s in self._package_steps()]

    def _meta_build_string(self) -> str:
        return bundle.meta_build_string(self.plan.bundle, self._meta_depends(), self.plan.build_number)

    def _check_clobbers(self) -> None:
        """Two packages of the bundle never install the same path: a build error naming both, not conda's warning."""
        owners = {s.data.name: stage.staged_files(Path(s.data.prefix)) for s in self._package_steps()}
        owners["onebit-bundle-" + self.plan.bundle] = [manifest.MANIFEST_PATH]
        problems = clobbers(owners)
        if problems:
            raise StageError(f"bundle {self.plan.bundle}: two packages install the same path:\n    " + "\n    ".join(problems[:20]),
                             hint="give each variant its own stage.root, or drop the file from one of them (stage.keep)")

    def do_metapackage(self, step: Step, progress, task) -> None:
        self._check_clobbers()
        nxt = Path(step.data.dir)
        shutil.rmtree(nxt, ignore_errors=True)
        nxt.mkdir(parents=True)
        doc = self._manifest()
        text = manifest.dumps(doc)
        (nxt / "manifest.json").write_text(text)
        # what this build knew (toolchain versions, sources, dropped shader features) travels beside its bundle
        # the facts that made the plan's keys, never a second probe
        record = toolchain_record.for_plan(self.plan, self.project, self.plan.host.tools, lambda d: _notes(Path(d)))
        (nxt / toolchain_record.FILE).write_text(toolchain_record.dumps(record))
        bundle.write_metapackage(bundle=self.plan.bundle, version=self.plan.version, build_number=self.plan.build_number,
                                 platform=self.plan.platform, summary=step.data.summary, depends=self._meta_depends(),
                                 manifest_text=text, out_dir=Path(step.data.out), scratch=self.layout.work / "meta-files")

    def _conda_files(self) -> list[Path]:
        return [s.data.file for s in self._package_steps()] + [self._meta_file()]

    def do_channel(self, step: Step, progress, task) -> None:
        package.index_channel(self._conda_files(), Path(step.data.dir), self.plan.platform)

    def do_tarball(self, step: Step, progress, task) -> None:
        trees = [Path(s.data.prefix) for s in self._package_steps()]
        text = (self.layout.next_out() / "manifest.json").read_bytes()  # written by the metapackage step
        bundle.write_tarball(Path(step.data.dir), trees, text, mtime=int(package.source_date().timestamp()))

    def do_checksums(self, step: Step, progress, task) -> None:
        f = Path(step.data.dir)
        package.sha256sums(f.parent, f)

    def do_publish(self, step: Step, progress, task) -> None:
        src = Path(step.data.dir)
        (src / KEY_FILE).write_text(step.key + "\n")
        swap.replace_dir(src, Path(step.data.to))


# Each step action and the function that runs it (the planners in plan.py make one action each). A registry rather
# than a method looked up by name: what can run is one table, and a plan with an action missing here is refused
# before its first step.
ACTIONS: dict[str, Callable[[Executor, Step, Progress, object], None]] = {
    "fetch": Executor.do_fetch,
    "submodules": Executor.do_submodules,
    "source": Executor.do_source,
    "crates": Executor.do_crates,
    "hf": Executor.do_hf,
    "toolchain": Executor.do_toolchain,
    "root": Executor.do_root,
    "wheels": Executor.do_wheels,
    "build": Executor.do_build,
    "stage": Executor.do_stage,
    "package": Executor.do_package,
    "metapackage": Executor.do_metapackage,
    "channel": Executor.do_channel,
    "tarball": Executor.do_tarball,
    "checksums": Executor.do_checksums,
    "publish": Executor.do_publish,
}
BUNDLE_ACTIONS = {"metapackage", "channel", "tarball", "checksums", "publish"}

NOTES_FILE = ".onebit-notes.json"  # in a build dir: what its configure reported (kinds' note_output)


def _notes(build_dir: Path) -> dict:
    """What the build reported about itself, plus what its stage found (stage.OFFLOAD_NOTES: the offload targets)."""
    out: dict = {}
    for name in (NOTES_FILE, stage.OFFLOAD_NOTES):
        try:
            out.update(json.loads((build_dir / name).read_text()))
        except (OSError, ValueError):
            pass
    return out


def _cmake_home(build_dir: Path) -> str | None:
    """The source dir a CMake build dir was configured for (CMakeCache.txt's CMAKE_HOME_DIRECTORY), if any."""
    try:
        text = (build_dir / "CMakeCache.txt").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("CMAKE_HOME_DIRECTORY:"):
            return line.split("=", 1)[1].strip()
    return None


def _holds(key_file: Path, key: str) -> bool:
    from .readfile import UnreadableFile, read_text

    try:
        return read_text(key_file, 4096).strip() == key
    except UnreadableFile:
        return False


def source_key_file(src: Path) -> Path:
    """Beside the checkout, not in it: the tree stays exactly the commit plus its patches."""
    return src.with_name(src.name + ".onebit-key")
