"""`pins status` and `pins bump`: resolve each pin, apply the guard rails, and propose the move (a PR or a local edit)."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..project import yamlio
from ..project.config import Pin, Recipe, load_pins
from ..errors import OnebitError, ValidationError
from . import decide, flags, gitops, isolate, report
from .decide import Edit, Move, Proposal, Verdict
from .edit import edit_pins, write_atomic
from .http import GitHub, HuggingFace
from .resolve import pair_value, partner_of, resolve

FORK = ("fork-rebase", "fork-merge")


@dataclass
class Options:
    names: Sequence[str] = ()
    cadence: str | None = None
    open_pr: bool = False
    dry_run: bool = False
    allow_rollback: bool = False
    reason: str | None = None
    remote: str = "origin"
    repo: str | None = None  # owner/name of this repository on GitHub
    base_branch: str | None = None
    report: Path | None = None  # evaluate only, into this directory (the workflow's job without a token)
    from_report: Path | None = None  # deliver what `report` wrote (the workflow's job with the token)


@dataclass
class Outcome:
    pin: str
    state: str  # current | proposed | edited | would-propose | already-proposed | held | refused | conflict | error
    detail: str = ""
    proposal: Proposal | None = None
    url: str | None = None
    fork: dict | None = None  # a fork update to push: {bundle, old_tip, new_tip, mode} (builders/pins/report.py)
    drift: list[int] = field(default_factory=list)  # the build-flag check requests of this outcome
    body: str | None = None  # the PR body of a move that is not a pin's Proposal (a build root's)

    @property
    def failed(self) -> bool:
        return self.state in ("held", "refused", "conflict", "error")


@dataclass
class Context:
    root: Path
    github: GitHub
    hf: HuggingFace
    token: str | None = None
    log: Callable[[str], None] = lambda msg: None
    pins: dict[str, Pin] = field(default_factory=dict)
    text: str = ""

    @property
    def pins_path(self) -> Path:
        return self.root / "pins.yaml"


def load(root: Path) -> tuple[dict[str, Pin], str]:
    path = Path(root) / "pins.yaml"
    pins, _doc, problems = load_pins(path)
    if problems:
        raise ValidationError(problems)
    return pins, path.read_text(encoding="utf-8")


def make_context(root: Path | str, env: dict | None = None, log: Callable[[str], None] | None = None) -> Context:
    env = os.environ if env is None else env
    ctx = Context(Path(root), GitHub.from_env(env), HuggingFace.from_env(env), GitHub.from_env(env).token, log or (lambda m: None))
    ctx.pins, ctx.text = load(ctx.root)
    return ctx


def recipes_for(root: Path, pin: str) -> list[tuple[Recipe, bool]]:
    """Recipes that build from `pin`: (recipe, True when the pin is its main source, so its patches apply)."""
    out = []
    for path in sorted((root / "recipes").glob("*.yaml")):
        try:
            doc = yamlio.load(path)
        except OnebitError:
            continue
        data = doc.data if isinstance(doc.data, dict) else {}
        src = data.get("source") if isinstance(data.get("source"), dict) else {}
        extra = [e.get("pin") for e in src.get("extra") or [] if isinstance(e, dict)]
        if src.get("pin") == pin or pin in extra:
            out.append((Recipe(name=str(data.get("name", path.stem)), path=path, data=data, doc=doc), src.get("pin") == pin))
    return out


# ------------------------------------------------------------------------------------------------------- status


@dataclass(frozen=True)
class StatusRow:
    pin: str
    policy: str
    current: str
    upstream: str
    state: str  # current | behind | unresolved | error

    @property
    def failed(self) -> bool:
        return self.state == "error"


def _label(sha: str | None, tag: str | None) -> str:
    return f"{tag} {decide.short(sha)}" if tag and sha else decide.short(sha)


def status(ctx: Context, names: Sequence[str] = ()) -> list[StatusRow]:
    order = list(ctx.pins)
    bad = decide.unknown_pins(order, names)
    if bad:
        raise OnebitError(f"no pin named {', '.join(map(repr, bad))}", where=str(ctx.pins_path), hint=f"pins: {', '.join(order)}")
    rows = []
    for name in [n for n in order if not names or n in names]:
        pin = ctx.pins[name]
        try:
            t = resolve(ctx.pins, name, ctx.github)
        except OnebitError as exc:
            rows.append(StatusRow(name, pin.policy, _label(pin.commit, pin.tag), "?", f"error: {exc.what}"))
            continue
        if pin.policy in FORK:
            old_up = (pin.raw.get("upstream") or {}).get("commit")
            current = f"{decide.short(pin.commit)} on {decide.short(old_up)}"
            offer = f"{decide.short(t.fork_head)} / upstream {decide.short(t.commit)}"
            behind = t.commit != old_up
            moved = t.fork_head != pin.commit
            state = "unresolved" if not pin.commit else ("behind" if behind else ("fork moved" if moved else "current"))
        else:
            current = _label(pin.commit, pin.tag)
            offer = _label(t.commit, t.tag)
            state = "unresolved" if not pin.commit else ("current" if t.commit == pin.commit else "behind")
        rows.append(StatusRow(name, pin.policy, current, offer, state))
    return rows


# ------------------------------------------------------------------------------------------------------- plan one pin


class Stop(Exception):
    """Ends the work on one pin with an outcome (not an error of the whole run)."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.detail)
        self.outcome = outcome


def _guard(what: str, v: Verdict, old: str | None, new: str, opts: Options, pin: str) -> None:
    why = decide.refusal(v, what=what, old=old, new=new, allow_rollback=opts.allow_rollback, reason=opts.reason)
    if why:
        raise Stop(Outcome(pin, "refused", why + "; pass --allow-rollback --reason TEXT if this is intended"))


def _commit_edits(name: str, pin: Pin, new: str, tag: str | None) -> list[Edit]:
    edits = [Edit(("pins", name, "commit"), new, replaces="unresolved", after=("policy",))]
    if tag is not None and (pin.policy in ("release", "tag-pattern")) and tag != pin.tag:
        edits.append(Edit(("pins", name, "tag"), tag, after=("commit",)))
    return edits


def _companions(ctx: Context, name: str, pin: Pin) -> tuple[list[Edit], list[tuple[str, str | None, str | None]]]:
    hf = (pin.raw.get("companions") or {}).get("huggingface")
    if not hf:
        return [], []
    rev = ctx.hf.revision(hf["repo"])
    edits: list[Edit] = []
    shown: list[tuple[str, str | None, str | None]] = []
    old_rev = hf.get("revision")
    if rev != old_rev or any(v is None for v in (hf.get("files") or {}).values()):
        base = ("pins", name, "companions", "huggingface")
        edits.append(Edit(base + ("revision",), rev, replaces="unresolved", after=("repo",)))
        shown.append((f"huggingface {hf['repo']} revision", old_rev, rev))
        files = hf.get("files") or {}
        hashes = ctx.hf.file_hashes(hf["repo"], rev, list(files))
        for fname, digest in hashes.items():
            if files.get(fname) != digest:
                edits.append(Edit(base + ("files", fname), digest))
                shown.append((f"sha256 {fname}", files.get(fname), digest))
    return edits, shown


def _patch_reports(ctx: Context, name: str, pin: Pin, url: str, commit: str) -> tuple[tuple[tuple[str, str], ...], tuple]:
    reports, checklist = [], []
    from ..inputs.patch import drift_report, render_markdown

    for recipe, main in recipes_for(ctx.root, name):
        cmds = tuple(str(c) for c in recipe.data.get("hardware_checklist") or [])
        if cmds:
            checklist.append((recipe.name, cmds))
        if not main:
            continue
        try:
            patches = recipe.patches(ctx.root)
        except Exception:  # a recipe the lead is still shaping: report instead of failing the bump
            reports.append((recipe.name, "Could not read the recipe's patch list."))
            continue
        if not patches:
            continue
        present = [p.path for p in patches if p.path.is_file()]
        missing = [p.file for p in patches if not p.path.is_file()]
        with gitops.Scratch() as s:
            s.fetch_tree(url, commit, where=pin.where)
            md = render_markdown(drift_report(s.dir, commit, present))
        if missing:
            md += "\n\nMissing patch files: " + ", ".join(f"`{m}`" for m in missing)
        reports.append((recipe.name, md))
    return tuple(reports), tuple(checklist)


def _drift(ctx: Context, name: str, pin: Pin, url: str, old: str | None, new: str, work: Path, requests: list) -> list[int]:
    """Check out what the build-flag check of each recipe that builds from `name` (its main source) needs; the
    indices of its requests (builders/pins/isolate.py runs the check itself, sandboxed)."""
    recipes = [r.name for r, main in recipes_for(ctx.root, name) if main]
    if not recipes:
        return []
    ctx.log(f"{name}: checking out upstream's build at {new[:12]} for {', '.join(recipes)}")
    requests.append(isolate.drift_request(ctx.root, name, url, old, new, recipes, work, f"trees/{len(requests)}",
                                          where=pin.where))
    return [len(requests) - 1]


def plan_pin(ctx: Context, name: str, opts: Options, *, work: Path, requests: list) -> Outcome:
    """(The evaluating part, no token) Resolve, guard and describe the move of one pin (with its tested-pair partner).
    Effects: only in `work` (a fork update as a git bundle, the trees for the build-flag check)."""
    pins = ctx.pins
    pin = pins[name]
    t = resolve(pins, name, ctx.github)
    partner = partner_of(pins, name)
    partner_new = pair_value(pins, partner, ctx.github) if partner else None
    moves: list[Move] = []
    edits: list[Edit] = []
    kept_tag = None
    fork = None
    worst = Verdict.IDENTICAL

    if pin.policy in FORK:
        up = pin.raw["upstream"]
        old_up = up.get("commit")
        if t.commit == old_up and t.fork_head == pin.commit and (not partner or partner_new == pins[partner].commit):
            return Outcome(name, "current", f"{decide.short(pin.commit)} on upstream {decide.short(old_up)}")
        verdicts: list[Verdict] = []

        def check_upstream(anc: gitops.Ancestry | None) -> None:
            v = decide.verdict(old_up, t.commit, old_in_new=anc and anc.old_in_new, new_in_old=anc and anc.new_in_old)
            verdicts.append(v)
            _guard(f"{name} upstream {up['branch']}", v, old_up, t.commit, opts, name)

        def check_tip(forward: bool, head: str) -> None:
            if forward or not pin.commit or head == pin.commit:
                return
            tag = decide.fork_tag(name, pin.commit)
            kept = gitops.ls_remote(pin.url, f"refs/tags/{tag}", where=pin.where).get(f"refs/tags/{tag}")
            if kept == pin.commit and pin.policy == "fork-rebase":
                return  # our own earlier rebase: the pinned tip is kept by its tag
            v = Verdict.DIVERGED
            verdicts.append(v)
            _guard(f"{name} fork branch {pin.branch} (now {head[:12]})", v, pin.commit, head, opts, name)

        mode = "rebase" if pin.policy == "fork-rebase" else "merge"
        res = gitops.update_fork(pin=name, mode=mode, fork_url=pin.url, branch=pin.branch, pinned=pin.commit or t.fork_head,
                                 upstream_url=up["url"], upstream_branch=up["branch"], old_up=old_up, new_up=t.commit,
                                 push=False, where=pin.where, check_tip=check_tip, check_upstream=check_upstream,
                                 bundle=work / f"fork-{name}.bundle")
        worst = next((v for v in verdicts if not v.forward and v is not Verdict.IDENTICAL), Verdict.AHEAD)
        if res.operated:
            kept_tag = res.kept_tag
            fork = {"bundle": res.bundle.name, "old_tip": res.old_tip, "new_tip": res.new_tip, "mode": mode}
        moves.append(Move(f"{name} ({pin.branch})", pin.commit, res.new_tip, compare=decide.compare_url(pin.url, pin.commit, res.new_tip)))
        moves.append(Move(f"upstream {up['branch']}", old_up, t.commit, compare=decide.compare_url(up["url"], old_up, t.commit),
                          count=res.count))
        new = res.new_tip
        edits += _commit_edits(name, pin, new, None)
        if t.commit != old_up:
            edits.append(Edit(("pins", name, "upstream", "commit"), t.commit, after=("branch", "url")))
        source_url = pin.url
        notes = None
    else:
        new = t.commit
        partner_current = not partner or partner_new == pins[partner].commit
        if new == pin.commit and partner_current:
            return Outcome(name, "current", _label(pin.commit, pin.tag))
        count = None
        if pin.commit and new != pin.commit:
            anc = gitops.ancestry(pin.url, pin.commit, new, new_ref=t.ref, where=pin.where)
            worst = decide.verdict(pin.commit, new, old_in_new=anc.old_in_new, new_in_old=anc.new_in_old)
            _guard(name, worst, pin.commit, new, opts, name)
            count = anc.count
        elif not pin.commit:
            worst = Verdict.NEW
        if new != pin.commit:
            moves.append(Move(name, pin.commit, new, pin.tag, t.tag, decide.compare_url(pin.url, pin.commit, new), count))
            edits += _commit_edits(name, pin, new, t.tag)
        source_url = pin.url
        notes = t.notes

    if partner and partner_new != pins[partner].commit:
        ppin = pins[partner]
        count = None
        if ppin.commit:
            pbranch = f"refs/heads/{ppin.branch}" if ppin.branch else None
            anc = gitops.ancestry(ppin.url, ppin.commit, partner_new, new_ref=pbranch, where=ppin.where)
            v = decide.verdict(ppin.commit, partner_new, old_in_new=anc.old_in_new, new_in_old=anc.new_in_old)
            _guard(f"{partner} (tested-pair partner of {name})", v, ppin.commit, partner_new, opts, name)
            if not v.forward:
                worst = v
            count = anc.count
        moves.append(Move(partner, ppin.commit, partner_new, compare=decide.compare_url(ppin.url, ppin.commit, partner_new), count=count))
        edits += _commit_edits(partner, ppin, partner_new, None)
    if not moves or all(m.old == m.new for m in moves):
        return Outcome(name, "current", _label(pin.commit, pin.tag))
    lead = next(m for m in moves if m.old != m.new) if moves[0].old == moves[0].new else moves[0]
    branch = decide.branch_name(name, lead.new)

    comp_edits, comp_shown = ([], []) if new == pin.commit else _companions(ctx, name, pin)
    edits += comp_edits
    reports, checklist = _patch_reports(ctx, name, pin, source_url, new) if new != pin.commit else ((), ())
    drift = _drift(ctx, name, pin, source_url, pin.commit, new, work, requests) if new != pin.commit else []
    if partner and partner_new != pins[partner].commit:
        p_reports, p_check = _patch_reports(ctx, partner, pins[partner], pins[partner].url, partner_new)
        reports, checklist = reports + p_reports, checklist + p_check
        drift += _drift(ctx, partner, pins[partner], pins[partner].url, pins[partner].commit, partner_new, work, requests)
    proposal = Proposal(
        pin=name, policy=pin.policy, moves=tuple(moves), branch=branch, release_notes=notes,
        release_url=t.notes_url, patch_reports=reports, checklist=checklist, companions=tuple(comp_shown),
        kept_tag=kept_tag, rollback_reason=opts.reason if not worst.forward and worst is not Verdict.IDENTICAL else None,
        verdict=worst, edits=tuple(edits),
    )
    return Outcome(name, "planned", proposal=proposal, fork=fork, drift=drift)


# ------------------------------------------------------------------------------------------------------- the PR side


class Repo:
    """This repository: where the bump branch is committed (plumbing; the working tree is not touched) and pushed."""

    def __init__(self, root: Path, remote: str, token: str | None):
        self.root = Path(root)
        self.remote = remote
        self.token = token
        top = gitops.git(["rev-parse", "--show-toplevel"], cwd=self.root, what="pins bump --open-pr needs a git checkout",
                         where=str(self.root)).stdout.strip()
        self.top = Path(top)
        self.rel = (self.root.resolve() / "pins.yaml").relative_to(self.top.resolve()).as_posix()

    def rel_of(self, path: str | None = None) -> str:
        """The repository path of `path` (relative to the project root; default pins.yaml)."""
        if path is None:
            return self.rel
        return (self.root.resolve() / path).relative_to(self.top.resolve()).as_posix()

    def head_text(self, path: str | None = None) -> str:
        rel = self.rel_of(path)
        return gitops.git(["show", f"HEAD:{rel}"], cwd=self.top, what=f"{path or 'pins.yaml'} is not committed").stdout

    def remote_url(self) -> str:
        if "://" in self.remote or self.remote.startswith("/"):
            return self.remote
        return gitops.git(["remote", "get-url", self.remote], cwd=self.top, what=f"no git remote {self.remote!r}").stdout.strip()

    def branch_exists(self, branch: str) -> bool:
        return bool(gitops.ls_remote(self.remote_url(), f"refs/heads/{branch}"))

    def current_branch(self) -> str:
        return gitops.git(["rev-parse", "--abbrev-ref", "HEAD"], cwd=self.top).stdout.strip()

    def commit_and_push(self, text: str, message: str, branch: str, path: str | None = None) -> str:
        """Commit `text` as `path` (relative to the project root; default pins.yaml) on top of HEAD, in a private index
        (the working tree and the checkout's index are not touched), and push the commit as `branch`."""
        return self.commit_files_and_push({path: text}, message, branch)

    def commit_files_and_push(self, files: dict, message: str, branch: str) -> str:
        """Commit each text of `files` (path relative to the project root, None for pins.yaml -> text) on top of HEAD
        in one commit, in a private index, and push it as `branch`."""
        with tempfile.TemporaryDirectory(prefix="onebit-index-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            gitops.git(["read-tree", "HEAD"], cwd=self.top, env=env)
            for path, text in sorted(files.items(), key=lambda kv: kv[0] or ""):
                rel = self.rel_of(path)
                blob = gitops.git(["hash-object", "-w", "--stdin"], cwd=self.top, input=text).stdout.strip()
                gitops.git(["update-index", "--add", "--cacheinfo", f"100644,{blob},{rel}"], cwd=self.top, env=env)
            tree = gitops.git(["write-tree"], cwd=self.top, env=env).stdout.strip()
        commit = gitops.git(["commit-tree", tree, "-p", "HEAD", "-m", message], cwd=self.top).stdout.strip()
        url = self.remote_url()
        gitops.git(["push", "--quiet", url, f"{commit}:refs/heads/{branch}"], cwd=self.top,
                   env=gitops.auth_env(url, self.token), what=f"cannot push {branch} to {self.remote}", hint="the token needs contents: write on this repository")
        return commit


def _commit_message(p: Proposal) -> str:
    lines = [p.title, ""]
    for m in p.moves:
        lines.append(f"{m.label}: {decide.short(m.old)} -> {decide.short(m.new)}")
    if p.rollback_reason:
        lines += ["", f"Rollback: {p.rollback_reason}"]
    if p.held:
        lines += ["", "Held: a recipe no longer matches upstream's build:"] + [f"- {r}" for r in p.held]
    return "\n".join(lines) + "\n"


def _check_options(ctx: Context, opts: Options) -> list[str]:
    order = list(ctx.pins)
    bad = decide.unknown_pins(order, opts.names)
    if bad:
        raise OnebitError(f"no pin named {', '.join(map(repr, bad))}", where=str(ctx.pins_path), hint=f"pins: {', '.join(order)}")
    if opts.allow_rollback and not (opts.reason or "").strip():
        raise OnebitError("--allow-rollback needs --reason TEXT", hint="say why the pin must move backwards or sideways")
    if opts.reason and not opts.allow_rollback:
        raise OnebitError("--reason is only used with --allow-rollback")
    return decide.select_pins(order, opts.names, {n: p.cadence for n, p in ctx.pins.items()}, opts.cadence)


def evaluate(ctx: Context, opts: Options, names: Sequence[str], work: Path) -> dict:
    """(The evaluating part: `python -m builders.pins evaluate`, sandboxed, no token) every pin of `names` planned;
    the report the token holder reads (builders/pins/report.py)."""
    requests: list[dict] = []
    outcomes: list[dict] = []
    done: set[str] = set()
    for name in names:
        if name in done:
            continue
        try:
            partner = partner_of(ctx.pins, name)
            done.update({name, partner} - {None})
            ctx.log(f"{name}: resolving ({ctx.pins[name].policy})")
            out = plan_pin(ctx, name, opts, work=work, requests=requests)
        except Stop as stop:
            out = stop.outcome
        except gitops.ForkConflict as exc:
            out = Outcome(name, "conflict", str(exc))
        except OnebitError as exc:
            out = Outcome(name, "error", str(exc))
        outcomes.append({"pin": out.pin, "state": out.state, "detail": out.detail, "fork": out.fork, "drift": out.drift,
                         "proposal": report.dump_proposal(out.proposal) if out.proposal else None})
    return {"version": report.VERSION, "outcomes": outcomes, "requests": requests,
            "pins_sha256": hashlib.sha256(ctx.text.encode()).hexdigest()}


STATES = ("current", "planned", "refused", "conflict", "error")


def _outcomes(ctx: Context, data, work: Path, drift: list[list[flags.VariantReport]]) -> list[Outcome]:
    """The evaluation report read back strictly, the build-flag reports joined to their proposals."""
    top = report._obj(data, "report", {"version", "outcomes", "requests", "pins_sha256"},
                      {"version", "outcomes", "requests", "pins_sha256"})
    if top["version"] != report.VERSION:
        raise report.ReportError(f"the evaluation report has version {top['version']!r}, not {report.VERSION}")
    if top["pins_sha256"] != hashlib.sha256(ctx.text.encode()).hexdigest():
        raise report.ReportError("the evaluation report was made from another pins.yaml than this checkout's",
                                 hint="evaluate and deliver at the same commit; nothing was pushed or opened")
    out = []
    for i, o in enumerate(report._list(top["outcomes"], "outcomes")):
        w = f"outcomes[{i}]"
        o = report._obj(o, w, {"pin", "state", "detail", "fork", "drift", "proposal"}, {"pin", "state", "detail"})
        pin = report._str(o["pin"], w, limit=100)
        if pin not in ctx.pins or o["state"] not in STATES:
            raise report.ReportError(f"the evaluation report names an unknown pin or state at {w}")
        pins = {pin} | ({partner_of(ctx.pins, pin)} - {None})
        prop = report.load_proposal(o["proposal"], f"{w}.proposal", pins) if o.get("proposal") is not None else None
        if (prop is None) != (o["state"] != "planned") or (prop and prop.pin != pin):
            raise report.ReportError(f"the evaluation report's {w} has a proposal that does not match its state")
        fork = report.load_fork(o.get("fork"), f"{w}.fork")
        if fork and (ctx.pins[pin].policy not in FORK or fork["bundle"] != f"fork-{pin}.bundle"):
            raise report.ReportError(f"the evaluation report's {w} updates a fork that is not this pin's")
        reps = []
        for k in report._list(o.get("drift", []), f"{w}.drift"):
            if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < len(drift):
                raise report.ReportError(f"the evaluation report's {w}.drift names no request")
            reps += drift[k]
        if prop is not None and reps:
            prop = dataclasses.replace(prop, flag_reports=tuple(flags.render_markdown(r) for r in reps),
                                       held=tuple(flags.hold_reasons(reps)))
        out.append(Outcome(pin, o["state"], report._str(o["detail"], w) or "", prop, fork=fork))
    return out


DRIFT = "drift-results.json"


def evaluate_isolated(ctx: Context, opts: Options, selected: Sequence[str], work: Path) -> tuple[dict, list]:
    """Both isolated parts (builders/pins/isolate.py) into `work`: report.json (the evaluation) and drift-results.json
    (the build-flag check), as plain data."""
    work.mkdir(parents=True, exist_ok=True)
    data = isolate.run_evaluation(ctx.root, ctx.pins, selected, work, allow_rollback=opts.allow_rollback,
                                  reason=opts.reason, log=ctx.log)
    requests = data.get("requests") if isinstance(data, dict) else None
    drift = isolate.run_drift(ctx.root, work, report._list(requests, "requests")) if requests else []
    report.write_file(work, DRIFT, [[report.dump_variant(r) for r in reps] for reps in drift])
    return data, drift


def read_evaluation(work: Path) -> tuple[dict, list]:
    """What evaluate_isolated left in `work` (a downloaded artifact), read back strictly."""
    data = report.load_file(work, isolate.REPORT, report.MAX_FILE)
    raw = report.load_file(work, DRIFT, report.MAX_FILE)
    drift = [[report.load_variant(v, f"drift[{i}][{j}]") for j, v in enumerate(report._list(reps, f"drift[{i}]"))]
             for i, reps in enumerate(report._list(raw, "drift"))]
    return data, drift


def pr_target(ctx: Context, opts: Options) -> tuple[Repo, str, str]:
    """(The token holder) where proposals go: this repository (pushed to opts.remote), its owner/name, the base branch."""
    ctx.github.need_token()
    repo = Repo(ctx.root, opts.remote, ctx.token)
    slug = opts.repo or os.environ.get("GITHUB_REPOSITORY") or decide.repo_slug(repo.remote_url())
    if not slug:
        raise OnebitError("cannot tell this repository's owner/name", hint="pass --repo OWNER/NAME or set GITHUB_REPOSITORY")
    base = opts.base_branch or os.environ.get("ONEBIT_PINS_BASE") or os.environ.get("GITHUB_REF_NAME") or repo.current_branch()
    return repo, slug, base


def already_proposed(ctx: Context, repo: Repo | None, slug: str | None, branch: str) -> str | None:
    """Whether `branch` was proposed before (the branch exists, or a PR of any state came from it): what says so."""
    if repo is None:
        return None
    if repo.branch_exists(branch):
        return f"branch {branch} exists"
    prs = ctx.github.pulls(slug, state="all", head=f"{slug.split('/')[0]}:{branch}")
    prs = [p for p in prs if (p.get("head") or {}).get("ref") == branch]
    if prs:
        return f"PR #{prs[0]['number']} ({prs[0].get('state')})"
    return None


def supersede(ctx: Context, slug: str, number: int, branch: str, older: Callable[[str], bool]) -> None:
    """Comment on and close every other open PR whose head branch `older` recognises (an earlier proposal of the same
    pin or root)."""
    for old in ctx.github.pulls(slug, state="open"):
        ref = (old.get("head") or {}).get("ref", "")
        if old["number"] != number and older(ref):
            ctx.github.comment(slug, old["number"], f"Superseded by #{number} ({branch}).")
            ctx.github.close_pull(slug, old["number"])


def propose_files(ctx: Context, target: tuple[Repo, str, str], name: str, files: dict, *, branch: str, title: str,
                  body: str, message: str, rollback: bool, older: Callable[[str], bool]) -> Outcome:
    """(The token holder) one move that is not a pin's (a build root's, a toolchain input's): its files committed on
    HEAD as one commit on `branch`, pushed, a PR opened (label rollback if so), older PRs of the same thing superseded;
    a branch proposed before opens nothing."""
    repo, slug, base = target
    try:
        seen = already_proposed(ctx, repo, slug, branch)
        if seen:
            return Outcome(name, "already-proposed", f"{branch} was already proposed ({seen}); nothing to do")
        repo.commit_files_and_push(files, message, branch)
        pr = ctx.github.create_pull(slug, title=title, head=branch, base=base, body=body)
        if rollback:
            ctx.github.add_labels(slug, pr["number"], [decide.ROLLBACK_LABEL])
        supersede(ctx, slug, pr["number"], branch, older)
    except OnebitError as exc:
        return Outcome(name, "error", str(exc))
    return Outcome(name, "proposed", f"PR #{pr['number']}: {title}", url=pr.get("html_url"), body=body)


@dataclass(frozen=True)
class FileMove:
    """A verified move of files that is not a pin's (a build root's, a toolchain input's), ready to deliver."""
    name: str  # the outcome's label: root:NAME, toolchain:NAME
    state: str  # would-propose, or the state reported as is
    detail: str
    files: dict = field(default_factory=dict)  # repo-relative path -> new text
    branch: str = ""
    title: str = ""
    body: str = ""
    message: str = ""
    rollback: bool = False
    older: Callable[[str], bool] = lambda ref: False  # an older PR's branch of the same thing


def deliver_files(ctx: Context, opts: Options, moves: Sequence[FileMove]) -> list[Outcome]:
    """Each move: a PR of its own (--open-pr: propose_files), a line (--dry-run), or its files written in place."""
    from ..io.swap import write_text_atomic

    target = None
    out: list[Outcome] = []
    for m in moves:
        if m.state != "would-propose":
            out.append(Outcome(m.name, m.state, m.detail))
            continue
        if opts.dry_run:
            out.append(Outcome(m.name, "would-propose", f"{m.title} on {m.branch}: {m.detail}", body=m.body))
            continue
        if not opts.open_pr:
            for path, text in m.files.items():
                write_text_atomic(Path(ctx.root) / path, text)
            out.append(Outcome(m.name, "edited", m.detail))
            continue
        if target is None:
            try:
                target = pr_target(ctx, opts)
            except OnebitError as exc:
                out.append(Outcome(m.name, "error", str(exc)))
                continue
        out.append(propose_files(ctx, target, m.name, m.files, branch=m.branch, title=m.title, body=m.body,
                                 message=m.message, rollback=m.rollback, older=m.older))
    return out


def bump(ctx: Context, opts: Options) -> list[Outcome]:
    """(The token holder) evaluate every selected pin in isolation (builders/pins/isolate.py), then push and open PRs
    from the report alone: nothing of upstream's is checked out or run in this process."""
    selected = _check_options(ctx, opts)
    repo = slug = base = None
    head_text = ctx.text
    if opts.open_pr and not opts.dry_run:
        repo, slug, base = pr_target(ctx, opts)
        head_text = repo.head_text()
        if head_text != ctx.text:
            raise OnebitError("pins.yaml differs from the committed one", where=str(ctx.pins_path),
                              hint="commit or stash the change first: a bump PR is based on HEAD")

    def proposed(branch: str) -> str | None:
        return already_proposed(ctx, repo, slug, branch)

    with tempfile.TemporaryDirectory(prefix="onebit-pins-eval-") as tmp:
        if opts.from_report:
            work = Path(opts.from_report)
            data, drift = read_evaluation(work)
        else:
            work = Path(opts.report) if opts.report else Path(tmp)
            data, drift = evaluate_isolated(ctx, opts, selected, work)
        outcomes = _outcomes(ctx, data, work, drift)
        if opts.report:
            return [Outcome(o.pin, "evaluated" if o.state == "planned" else o.state,
                            o.detail or (o.proposal.title if o.proposal else ""), o.proposal) for o in outcomes]
        for k, out in enumerate(outcomes):
            if out.state != "planned":
                continue
            seen = proposed(out.proposal.branch)
            if seen:
                outcomes[k] = Outcome(out.pin, "already-proposed", f"{out.proposal.branch} was already proposed ({seen}); nothing to do")
                continue
            if out.fork and not opts.dry_run:
                pin = ctx.pins[out.pin]
                try:
                    gitops.push_fork(pin=out.pin, fork_url=pin.url, branch=pin.branch, bundle=work / out.fork["bundle"],
                                     old_tip=out.fork["old_tip"], new_tip=out.fork["new_tip"], mode=out.fork["mode"],
                                     token=ctx.token, where=pin.where)
                except OnebitError as exc:
                    outcomes[k] = Outcome(out.pin, "error", str(exc), out.proposal)
                    continue
            outcomes[k] = _deliver(ctx, out, opts, repo, slug, base, head_text)

    if not opts.open_pr and not opts.dry_run:
        planned = [o for o in outcomes if o.state == "edited"]
        if planned and not any(o.failed for o in outcomes):
            edits = [e for o in planned for e in o.proposal.edits]
            write_atomic(ctx.pins_path, edit_pins(ctx.text, edits, where=ctx.pins_path))
        elif planned:
            for o in planned:
                o.state, o.detail = "not-written", "pins.yaml was left untouched because another pin failed"
    return outcomes


def _deliver(ctx: Context, out: Outcome, opts: Options, repo: Repo | None, slug: str | None, base: str | None,
             head_text: str) -> Outcome:
    p = out.proposal
    try:
        new_text = edit_pins(head_text, p.edits, where=ctx.pins_path)  # verifies the edit even for --dry-run
    except OnebitError as exc:
        return Outcome(out.pin, "error", str(exc), p)
    why = "held: " + "; ".join(p.held) if p.held else ""
    if opts.dry_run:
        return Outcome(out.pin, "held", f"would propose {p.title} on {p.branch}, {why}", p) if p.held else \
            Outcome(out.pin, "would-propose", f"{p.title} on {p.branch}", p)
    if not opts.open_pr:
        return Outcome(out.pin, "held", f"{p.title}: pins.yaml is not edited, {why}", p) if p.held else \
            Outcome(out.pin, "edited", p.title, p)
    try:
        repo.commit_and_push(new_text, _commit_message(p), p.branch)
        body = decide.render_pr_body(p)
        pr = ctx.github.create_pull(slug, title=p.title, head=p.branch, base=base, body=body)
        labels = [decide.ROLLBACK_LABEL] * bool(p.rollback_reason) + [decide.HELD_LABEL] * bool(p.held)
        if labels:
            ctx.github.add_labels(slug, pr["number"], labels)
        supersede(ctx, slug, pr["number"], p.branch, lambda ref: decide.is_branch_of(out.pin, ref))
    except OnebitError as exc:
        return Outcome(out.pin, "error", str(exc), p)
    if p.held:
        return Outcome(out.pin, "held", f"PR #{pr['number']} (label {decide.HELD_LABEL}): {p.title}, {why}", p, pr.get("html_url"))
    return Outcome(out.pin, "proposed", f"PR #{pr['number']}: {p.title}", p, pr.get("html_url"))
