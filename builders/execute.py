"""Execute a plan: run each step's commands, skip steps whose cache key was already built, show progress."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from . import companions, fetch, manifest, package, patch, stage
from .config import Project
from .errors import BuildError, StageError
from .kinds import KINDS
from .plan_types import Command, Plan, Step

BUNDLE_ACTIONS = {"metapackage", "channel", "tarball", "checksums", "publish"}
_NINJA = re.compile(r"^\[(\d+)/(\d+)\]")
KEY_FILE = ".onebit-key"


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
        self.console = console or Console(stderr=True)
        self.layout = plan.layout
        self.report = Report()
        self.log_dir = self.layout.work / "logs"

    # ---- cache -------------------------------------------------------------------------------------------------
    def _bundle_done(self) -> bool:
        key_file = self.layout.out / KEY_FILE
        publish = next((s for s in self.plan.steps if s.action == "publish"), None)
        return publish is not None and key_file.is_file() and key_file.read_text().strip() == publish.key

    def _outputs_exist(self, step: Step) -> bool:
        d = step.data
        if step.action == "fetch":
            return fetch.cached(Path(d["dest"]), d["commit"])
        if step.action == "wheels":
            return (Path(d["dir"]) / ".complete").is_file()
        if step.action == "submodules":
            return Path(d["lock"]).is_file()
        if step.action == "crates":
            return companions.crates_ready(Path(d["dir"]))
        if step.action == "hf":
            return companions.hf_ready(Path(d["dir"]), d["files"])
        if step.action == "source":
            return Path(d["dir"]).is_dir()
        if step.action == "build":
            return Path(d["build_dir"]).is_dir()
        if step.action == "stage":
            return Path(d["prefix"]).is_dir()
        if step.action == "package":
            return (Path(d["out"]) / package.conda_filename(d["name"], d["version"], d["build_string"])).is_file()
        return False

    def is_cached(self, step: Step) -> bool:
        if self.force:
            return False
        if step.action in BUNDLE_ACTIONS:
            return self._bundle_done()
        return self.layout.step_stamp(step.key).is_file() and self._outputs_exist(step)

    def _stamp(self, step: Step) -> None:
        if step.action in BUNDLE_ACTIONS:
            return
        package.write_text_atomic(self.layout.step_stamp(step.key), json.dumps({"id": step.id, "key": step.key, "time": time.time()}))

    # ---- running -----------------------------------------------------------------------------------------------
    def run(self) -> Report:
        with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=self.console, transient=False) as progress:
            overall = progress.add_task(f"{self.plan.bundle}: {len(self.plan.steps)} steps", total=len(self.plan.steps))
            for step in self.plan.steps:
                if self.is_cached(step):
                    self.report.cached.append(step.id)
                    progress.advance(overall)
                    continue
                task = progress.add_task(step.title, total=None)
                started = time.monotonic()
                getattr(self, "_do_" + step.action.replace("-", "_"))(step, progress, task)
                self._stamp(step)
                self.report.seconds[step.id] = time.monotonic() - started
                self.report.ran.append(step.id)
                progress.update(task, total=1, completed=1)
                progress.advance(overall)
        return self.report

    def _run_commands(self, step: Step, commands, progress: Progress, task, *, checker: Callable | None = None) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / (step.id.replace(":", "-").replace("/", "_") + ".log")
        with open(log_path, "w") as log:
            for i, cmd in enumerate(commands):
                output = self._run_one(cmd, log, progress, task)
                problem = checker(i, output) if checker else None
                if problem:
                    raise BuildError(problem, where=step.data.get("where", step.id), hint=f"full log: {log_path}")

    def _run_one(self, cmd: Command, log, progress: Progress, task) -> str:
        env = {**os.environ, **dict(cmd.env)}
        log.write(f"$ {cmd.shell()}\n")
        log.flush()
        try:
            proc = subprocess.Popen(cmd.argv, cwd=cmd.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, errors="replace")
        except FileNotFoundError:
            raise BuildError(f"command not found: {cmd.argv[0]}", hint="install it, or check the recipe's toolchain") from None
        captured = []
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            captured.append(line)
            m = _NINJA.match(line)
            if m:
                progress.update(task, completed=int(m.group(1)), total=int(m.group(2)))
                log.flush()  # so `tail -f` on the log follows the build
        rc = proc.wait()
        if rc != 0:
            tail = "".join(captured[-25:])
            raise BuildError(f"command failed (exit {rc}): {cmd.shell()}\n{tail}", hint=f"full log: {log.name}")
        return "".join(captured)

    # ---- actions -----------------------------------------------------------------------------------------------
    def _do_fetch(self, step: Step, progress, task) -> None:
        pin = self.project.pins[step.data["pin"]]
        how = fetch.fetch_pin(pin, Path(step.data["dest"]), self.layout.downloads(), offline=self.offline,
                              log=lambda m: progress.update(task, description=f"{step.title}: {m}"))
        self.console.log(f"fetched {pin.name} @ {pin.short} from {how}")

    def _do_wheels(self, step: Step, progress, task) -> None:
        fetch.fetch_wheels(step.data["requirements"], Path(step.data["dir"]), offline=self.offline)

    def _do_submodules(self, step: Step, progress, task) -> None:
        d = step.data
        subs = companions.fetch_submodules(self.layout.git_cache, Path(d["git_dir"]), d["commit"], d["url"], d["want"],
                                           Path(d["lock"]), offline=self.offline,
                                           log=lambda m: progress.update(task, description=f"{step.title}: {m}"))
        self.console.log(f"submodules of {d['pin']}: " + ", ".join(f"{s.path} @ {s.commit[:7]}" for s in subs))

    def _do_crates(self, step: Step, progress, task) -> None:
        d = step.data
        how = companions.vendor_crates(Path(d["source"]), d["manifest"], Path(d["dir"]), offline=self.offline)
        self.console.log(f"crates of {d['manifest']}: {how}")

    def _do_hf(self, step: Step, progress, task) -> None:
        d = step.data
        how = companions.fetch_hf(d["repo"], d["revision"], d["files"], Path(d["dir"]), where=d["where"], offline=self.offline,
                                  log=lambda m: progress.update(task, description=f"{step.title}: {m}"))
        self.console.log(f"{d['repo']} @ {d['revision'][:7]}: {how}")

    def _do_source(self, step: Step, progress, task) -> None:
        src = Path(step.data["dir"])
        shutil.rmtree(src, ignore_errors=True)
        for cache_dir in {c.argv[2] for c in step.commands if c.argv[1:2] == ("--git-dir",)}:
            subprocess.run(["git", "--git-dir", cache_dir, "worktree", "prune"], capture_output=True)
        clone_cmds = [c for c in step.commands if "apply" not in c.argv]
        self._run_commands(step, clone_cmds, progress, task)
        if step.data.get("submodules_lock"):
            companions.checkout_submodules(src, Path(step.data["submodules_lock"]), self.layout.git_cache)
        results = patch.apply_all(src, [Path(p) for p in step.data["patches"]], where=step.data["where"])
        for r in results:
            self.console.log(f"patch {r.patch}: {r.status}{' ' + r.detail if r.detail else ''}")

    def _do_build(self, step: Step, progress, task) -> None:
        build_dir = Path(step.data["build_dir"])
        if step.data.get("fresh_dir"):
            shutil.rmtree(build_dir, ignore_errors=True)
        build_dir.mkdir(parents=True, exist_ok=True)
        kind = KINDS[step.data["kind"]]
        self._run_commands(step, step.commands, progress, task, checker=getattr(kind, "check_output", None))

    def _do_stage(self, step: Step, progress, task) -> None:
        d = step.data
        tmp_root, tmp_prefix = Path(d["stage_tmp"]), Path(d["tmp_prefix"])
        shutil.rmtree(tmp_root, ignore_errors=True)
        tmp_prefix.mkdir(parents=True)
        self._run_commands(step, step.commands, progress, task)
        stage.prune(tmp_prefix, d["keep"])
        stage.relocate(tmp_prefix)
        forbidden = [("the build tree", d["build_dir"]), ("the work dir", str(self.layout.work)), ("$HOME", d["home"])]
        problems = stage.check_rpaths(tmp_prefix, forbidden)
        if problems:
            raise StageError("RPATH check failed:\n    " + "\n    ".join(problems),
                             hint="a binary would load libraries from the build machine; fix the recipe's link flags")
        for name, rel in d["binaries"].items():
            if not (tmp_prefix / rel).exists():
                raise StageError(f"binary {name!r} ({rel}) is not in the staged tree", where=d["variant"],
                                 hint="check stage.binaries and stage.keep in the recipe")
        if d["manifest_entry"]:
            entry_file = tmp_prefix / "share" / "onebit" / "backends" / f"{d['variant']}.json"
            entry_file.parent.mkdir(parents=True, exist_ok=True)
            entry_file.write_text(json.dumps({"backend": d["backend"], **d["manifest_entry"]}, indent=2, sort_keys=True))
        self._recipe_tests(step, tmp_prefix)
        package.replace_dir(tmp_root, Path(d["stage_root"]))

    def _recipe_tests(self, step: Step, prefix: Path) -> None:
        for test in step.data["tests"]:
            if test.get("needs"):
                self.console.log(f"[yellow]skip[/] test '{test['name']}' of {step.data['variant']}: needs {test['needs']}")
                continue
            values = step.data["test_values"]
            argv = [str(prefix / test["run"][0])] + [a.format(**values) for a in test["run"][1:]]
            proc = subprocess.run(argv, capture_output=True, text=True, cwd=prefix, timeout=120,
                                  env={k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"})
            output = proc.stdout + proc.stderr
            expect = test.get("expect")
            pattern = expect.replace("{commit7}", values["commit7"]).replace("{commit}", values["commit"]) if expect else None
            if proc.returncode != 0 or (pattern and not re.search(pattern, output)):
                raise StageError(f"recipe test '{test['name']}' failed for {step.data['variant']}: "
                                 f"{' '.join(test['run'])} exited {proc.returncode}; expected /{pattern}/\n{output[-1500:]}")
            self.console.log(f"[green]ok[/] test '{test['name']}' of {step.data['variant']}")

    def _do_package(self, step: Step, progress, task) -> None:
        d = step.data
        package.assemble(name=d["name"], version=d["version"], build_string=d["build_string"], build_number=d["build_number"],
                         files_dir=Path(d["prefix"]), out_dir=Path(d["out"]), platform=self.plan.platform, license=d["license"],
                         summary=d["summary"], homepage=d["homepage"])

    def _package_steps(self) -> list[Step]:
        return [s for s in self.plan.steps if s.action == "package"]

    def _manifest(self) -> dict:
        entries = []
        for s in self.plan.steps:
            if s.action == "stage" and s.data["manifest_entry"]:
                entries.append((s.data["backend"], s.data["manifest_entry"]))
        return manifest.make_manifest(self.plan.bundle, self.plan.version, self.plan.build_number, self.plan.platform, entries)

    def _meta_file(self) -> Path:
        meta = self.plan.step("bundle:metapackage")
        return Path(meta.data["out"]) / package.conda_filename(meta.data["name"], self.plan.version, f"h{meta.key[:7]}_{self.plan.build_number}")

    def _do_metapackage(self, step: Step, progress, task) -> None:
        nxt = self.layout.next_out()
        shutil.rmtree(nxt, ignore_errors=True)
        nxt.mkdir(parents=True)
        doc = self._manifest()
        text = manifest.dumps(doc)
        (nxt / "manifest.json").write_text(text)
        depends = [f"{s.data['name']} =={s.data['version']} {s.data['build_string']}" for s in self._package_steps()]
        with_files = self.layout.work / "meta-files"
        shutil.rmtree(with_files, ignore_errors=True)
        (with_files / "share" / "onebit").mkdir(parents=True)
        (with_files / manifest.MANIFEST_PATH).write_text(text)
        package.assemble(name=step.data["name"], version=self.plan.version, build_string=f"h{step.key[:7]}_{self.plan.build_number}",
                         build_number=self.plan.build_number, files_dir=with_files, out_dir=Path(step.data["out"]),
                         platform=self.plan.platform, license="Apache-2.0", summary=step.data["summary"], depends=depends)

    def _conda_files(self) -> list[Path]:
        files = [Path(s.data["out"]) / package.conda_filename(s.data["name"], s.data["version"], s.data["build_string"])
                 for s in self._package_steps()]
        return files + [self._meta_file()]

    def _do_channel(self, step: Step, progress, task) -> None:
        package.index_channel(self._conda_files(), Path(step.data["dir"]), self.plan.platform)

    def _do_tarball(self, step: Step, progress, task) -> None:
        trees = [Path(s.data["prefix"]) for s in self.plan.steps if s.action == "stage"]
        text = (self.layout.next_out() / "manifest.json").read_bytes()  # written by the metapackage step
        out = Path(step.data["file"])
        top = out.name.removesuffix(".tar.zst")
        package.tar_zst(trees, {manifest.MANIFEST_PATH: text}, out, top)

    def _do_checksums(self, step: Step, progress, task) -> None:
        f = Path(step.data["file"])
        package.sha256sums(f.parent, f)

    def _do_publish(self, step: Step, progress, task) -> None:
        src = Path(step.data["from"])
        (src / KEY_FILE).write_text(step.key + "\n")
        package.replace_dir(src, Path(step.data["to"]))
