"""`1bit` console script: `1bit serve ...` and `1bit version`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import sys

from .errors import ManifestError, ServeError
from .hostlibs import look_up
from .hosts import bind_refusal
from .inspect import inspect_model
from .laya import ALL_CLASSES, CHECKPOINT_RELPATH, LAYA_MODEL_ENV, default_model_dir, load_policy
from .manifest import MANIFEST_ENV, default_manifest_path, load_manifest
from .recipes import default_recipes_path, load_recipes
from .devices import DEVICES, Capabilities, capabilities
from .launch_plan import Refusal
from .laya_route import laya_refusal
from .route import route
from .serve_flags import RouteEnv, ServeFlags

# A refused `1bit serve` launch (nothing started): exit status EXIT_REFUSED when the route refuses (a device, feature
# or bind this bundle cannot serve), ServeError's 2 for bad input (an unreadable model, a bad manifest); either way
# the first stderr line is the reason, and it is also written to $ONEBIT_SERVE_REFUSAL_FILE where that is set (the
# engine's Lemonade `onebit` backend sets it per load, reads the line and shows it as the load error:
# docs/lemonade.md, docs/lemonade/patches/0003-*.patch).
EXIT_REFUSED = 3
REFUSAL_FILE_ENV = "ONEBIT_SERVE_REFUSAL_FILE"

USAGE = """usage: 1bit <command> [args]

commands:
  serve     serve a model with the bundle's llama-server (1bit serve -h)
  route     ask the Laya router which device a request goes to (1bit route -h)
  check     check the installed bundle: route self-tests and a device probe of every backend
  version   print `1bit <version>` (--verbose: the bundle, its backends and onebit)
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (and no usage dump)."""

    def error(self, message: str):
        raise ServeError(f"{message} (see {self.prog} -h)")


class _PlainText(argparse.HelpFormatter):
    """The description is shown as it is: argparse would %-format it, and it may carry a manifest's path or text."""

    def _format_text(self, text: str) -> str:
        width = max(self._width - self._current_indent, 11)
        return self._fill_text(text, width, " " * self._current_indent) + "\n\n"


def _serve_parser(caps: Capabilities | None = None, manifest_note: str = "") -> argparse.ArgumentParser:
    """`1bit serve`'s options. With the installed bundle's capabilities, --help shows only what that bundle can do
    (the options stay accepted: route refuses what the bundle cannot serve, in one line naming what to install);
    without them (no manifest, a checkout) it lists everything and says so."""

    def shown(ok: bool, text: str) -> str:
        return text if caps is None or ok else argparse.SUPPRESS

    devices = caps.devices if caps is not None else DEVICES
    description = ("Serve a GGUF model (or 1BP package) with the right backend of this bundle. "
                   "Arguments serve does not know are passed to llama-server unchanged.")
    if caps is None:
        description += f" {manifest_note or 'No bundle manifest found'}: every option is listed, whether or not a " \
                       "bundle here can serve it."
    ap = _Parser(prog="1bit serve", allow_abbrev=False, description=description, formatter_class=_PlainText)
    llama = caps is None or caps.llama_server
    ap.add_argument("-m", "--model", required=True, help="model file (GGUF or 1BP package)")
    ap.add_argument("--device", default="auto", type=_device, metavar="{" + ",".join(devices) + "}",
                    help="backend device (default: auto: the first of vulkan, cuda, hrx, rocm, cpu in this bundle)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    ap.add_argument("--allow-remote", action="store_true",
                    help="allow listening beyond loopback: a --host that is not loopback, or a backend that always "
                    "listens on every interface (zinc); exposes the server to the network")
    ap.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                    help="proxy mode: another Host/Origin name to answer (e.g. behind a reverse proxy)")
    ap.add_argument("--max-body", type=_size, default=None, metavar="BYTES",
                    help="proxy mode: largest request body (e.g. 64M, 1G; default 256M)")
    ap.add_argument("--port", type=int, default=None, help="public port (default 8080)")
    ap.add_argument("-c", "--ctx-size", type=int, default=None, metavar="N", help="context size in tokens")
    ap.add_argument("-fa", "--flash-attn", nargs="?", const="on", default=None, choices=["on", "off", "auto"],
                    help=shown(llama, "llama-server flash attention (on, off, auto)"))
    ap.add_argument("-a", "--alias", default=None, metavar="NAME", help="the model name the server answers under")
    ap.add_argument("-np", "--parallel", type=int, default=None, metavar="N", help="requests served at once")
    ap.add_argument("--dflash", metavar="DRAFT", help=shown(llama, "DFlash drafter GGUF"))
    ap.add_argument("--mtp", metavar="HEAD", help=shown(llama, "MTP head GGUF"))
    ap.add_argument("--mtp-max", type=int, metavar="N", help=shown(llama, "with --mtp: most tokens drafted per step"))
    ap.add_argument("--mtp-p-min", type=float, metavar="P",
                    help=shown(llama, "with --mtp: least draft probability kept"))
    ap.add_argument("--mmproj", metavar="F", help=shown(llama, "multimodal projector GGUF (images)"))
    ap.add_argument("--moe-slots", type=int, metavar="N",
                    help=shown(caps is not None and caps.moe_slots, "vulkan only: keep N experts resident"))
    ap.add_argument("--prefill-device", choices=["hrx"],
                    help=shown(caps is not None and caps.prefill_hrx, "prefill on HRX, decode on vulkan"))
    ap.add_argument("--prefill-min-tokens", type=int, default=1024, metavar="N",
                    help=shown(caps is not None and caps.prefill_hrx,
                               "with --prefill-device: prompts of N tokens or more prefill on HRX (default 1024)"))
    ap.add_argument("--long-model", metavar="FILE",
                    help=shown(llama, "second model for prompts of --long-from tokens or more"))
    ap.add_argument("--long-from", type=int, default=2048, metavar="N",
                    help=shown(llama, "with --long-model: the prompt length that goes to it (default 2048)"))
    ap.add_argument("--adaptive", action="store_true",
                    help=shown(caps is not None and caps.adaptive, "vulkan first, rocm takes the overflow"))
    ap.add_argument("--adaptive-at", type=int, default=8, metavar="N",
                    help=shown(caps is not None and caps.adaptive,
                               "with --adaptive: requests vulkan takes before rocm gets the next (default 8)"))
    laya = caps is not None and caps.laya
    ap.add_argument("--laya", action="store_true",
                    help=shown(laya, "route each conversation by its Laya class (docs: onebit/laya.py)"))
    ap.add_argument("--laya-model", metavar="DIR",
                    help=shown(laya, "Laya checkpoint (default: $ONEBIT_LAYA_MODEL, the bundle's); implies --laya"))
    ap.add_argument("--route-policy", metavar="FILE",
                    help=shown(laya, "Laya policy: class -> device (default: the shipped one)"))
    ap.add_argument("--manifest", help=f"bundle manifest (default: the install's share/onebit/manifest.json; ${MANIFEST_ENV})")
    ap.add_argument("--recipes", metavar="FILE", help="serve recipes JSON (default: the bundle's)")
    ap.add_argument("--no-recipes", action="store_true", help="apply no serve recipes")
    ap.add_argument("--llama-server", metavar="PATH",
                    help=shown(llama, "llama-server binary (default: $ONEBIT_LLAMA_SERVER, the manifest, PATH)"))
    ap.add_argument("--dry-run", action="store_true", help="print the launch plan as JSON and exit")
    return ap


def _help_parser(argv: list[str], env) -> argparse.ArgumentParser:
    """The parser `1bit serve --help` prints: the installed bundle's capabilities, or every option without one."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--manifest")
    known, _ = pre.parse_known_args(argv)
    path = default_manifest_path(known.manifest, env)
    try:
        manifest = load_manifest(path)
    except ManifestError as e:
        return _serve_parser(None, f"{e}".split(";")[0])
    laya = bool(env.get(LAYA_MODEL_ENV)) or (manifest.prefix / CHECKPOINT_RELPATH).is_dir()
    return _serve_parser(capabilities(manifest, laya))


def _device(text: str) -> str:
    """Any device serve knows (not only this bundle's: route names the bundle to install for the others)."""
    if text not in DEVICES:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(DEVICES)})")
    return text


def _size(text: str) -> int:
    """A byte count: 1048576, 64K, 64M, 1G (also 64MB, 64MiB)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmg]?)(?:i?b)?\s*", text.lower())
    if not m or int(m[1]) <= 0:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use bytes, or 64M, 1G)")
    return int(m[1]) * {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[m[2]]


def _host_in_extra(extra) -> list[str]:
    """--host values hidden in the arguments passed through to llama-server (they would override ours)."""
    hosts = []
    for i, a in enumerate(extra):
        if a == "--host" and i + 1 < len(extra):
            hosts.append(extra[i + 1])
        elif a.startswith("--host="):
            hosts.append(a.split("=", 1)[1])
    return hosts


def _load_manifest_for_serve(args, env):
    path = default_manifest_path(args.manifest, env)
    try:
        return load_manifest(path)
    except ManifestError:
        explicit = args.manifest or env.get(MANIFEST_ENV)
        if not explicit and (args.llama_server or env.get("ONEBIT_LLAMA_SERVER")):
            return None  # no bundle: run the given llama-server
        raise


def _recipes(args, manifest):
    if args.no_recipes:
        return ()
    if args.recipes:
        return load_recipes(args.recipes)
    if manifest is not None and manifest.recipes is not None:
        return load_recipes(manifest.recipes)
    return load_recipes(default_recipes_path())


def plan_from_args(argv: list[str], env=None):
    """Parse `1bit serve` arguments, gather the facts, and return (plan or refusal, parsed args)."""
    env = dict(os.environ if env is None else env)
    parser = _help_parser(argv, env) if ("-h" in argv or "--help" in argv) else _serve_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and extra[0] == "--":
        extra = extra[1:]
    flags = ServeFlags(
        model=args.model, device=args.device, host=args.host, port=args.port, ctx_size=args.ctx_size,
        flash_attn=args.flash_attn, alias=args.alias, parallel=args.parallel, dflash=args.dflash, mtp=args.mtp,
        mtp_max=args.mtp_max, mtp_p_min=args.mtp_p_min, mmproj=args.mmproj, moe_slots=args.moe_slots,
        prefill_device=args.prefill_device, prefill_min_tokens=args.prefill_min_tokens,
        long_model=args.long_model, long_from=args.long_from, adaptive=args.adaptive,
        adaptive_at=args.adaptive_at, laya=bool(args.laya or args.laya_model), laya_model=args.laya_model,
        route_policy=args.route_policy, llama_server=args.llama_server, allow_remote=args.allow_remote,
        extra=tuple(extra),
    )
    for host in [args.host, *_host_in_extra(extra)]:  # refuse before touching any file
        why = bind_refusal(host, args.allow_remote)
        if why:
            return Refusal(message=why, rule="remote-bind"), args
    refused = laya_refusal(flags, None)
    if refused is not None:  # refuse before touching any file
        return refused, args
    manifest = _load_manifest_for_serve(args, env)
    facts = inspect_model(args.model)
    draft = inspect_model(args.dflash) if args.dflash else None
    long_facts = inspect_model(args.long_model) if args.long_model else None
    recipes = _recipes(args, manifest)
    from .launch import free_ports

    policy = None
    if flags.laya:
        policy = load_policy(flags.route_policy, DEVICES[1:])
        if not flags.laya_model:
            prefix = manifest.prefix if manifest is not None else default_manifest_path(None, env).parent.parent.parent
            flags = dataclasses.replace(flags, laya_model=str(default_model_dir(prefix, env)))
    # loopback ports for children behind the proxy (--long-model, --adaptive, --laya, or a program that cannot take
    # the alias); an exec'd server uses none of them
    n_ports = 1 + len(ALL_CLASSES) if flags.laya else 2
    renv = RouteEnv(env=env, path_llama_server=shutil.which("llama-server", path=env.get("PATH")),
                    free_ports=free_ports(n_ports),
                    host_libs=look_up(manifest.host_sonames(), env) if manifest is not None else None)
    return route(facts, flags, manifest, renv, recipes, draft=draft, long_facts=long_facts, laya_policy=policy), args


def refuse(line: str, env=None) -> None:
    """Say why a launch was refused: the first line on stderr, and the same line in $ONEBIT_SERVE_REFUSAL_FILE where
    that is set (written beside it and renamed into place; a file that cannot be written costs only itself)."""
    print(line, file=sys.stderr, flush=True)
    path = (os.environ if env is None else env).get(REFUSAL_FILE_ENV)
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        # created anew, never through a link or over a file someone else planted (the file may sit in a shared
        # directory); the rename replaces a link at `path` itself, never what it points to
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(line.splitlines()[0] + "\n")
        os.replace(tmp, path)
    except FileExistsError:  # not ours: leave it alone
        return
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def serve_main(argv: list[str]) -> int:
    plan, args = plan_from_args(argv)
    if isinstance(plan, Refusal):
        if args.dry_run:
            print(json.dumps(plan.to_json(), indent=2))
        refuse(f"1bit serve: refused: {plan.message}")
        return EXIT_REFUSED
    if args.dry_run:
        print(json.dumps(plan.to_json(), indent=2))
        return 0
    from .launch import exec_child, run_proxied

    for c in plan.children:
        for note in c.notes:
            print(f"1bit serve: {c.backend}: {note}", file=sys.stderr)
    if plan.mode == "exec":
        exec_child(plan.children[0])  # does not return
        return 1
    return run_proxied(plan, laya=_laya_router(plan, args) if plan.proxy.laya is not None else None,
                       max_body=args.max_body, allowed_hosts=tuple(args.allowed_host))


def _laya_router(plan, args):
    """The proxy's Laya router: the pinned checkpoint (verified) and the policy the plan was made with."""
    from pathlib import Path

    from .laya import PYTHON_RELPATH, LayaClassifier, Router

    spec = plan.proxy.laya
    prefix = default_manifest_path(args.manifest).resolve().parent.parent.parent
    classifier = LayaClassifier(Path(spec.model_dir), python_path=prefix / PYTHON_RELPATH)
    policy = load_policy(args.route_policy, DEVICES[1:])
    return Router(classifier, policy, spec.classes, spec.default)


def route_main(argv: list[str]) -> int:
    """`1bit route --laya-model DIR --classify --state TEXT`: the class, confidence and device of one request."""
    from pathlib import Path

    from .laya import classify_main

    ap = _Parser(prog="1bit route", allow_abbrev=False,
                 description="Ask the Laya router where a request goes; prints `<class> <confidence> <device>`.")
    ap.add_argument("--laya-model", metavar="DIR", help="Laya checkpoint (default: $ONEBIT_LAYA_MODEL, the bundle's)")
    ap.add_argument("--classify", action="store_true", required=True, help="classify --state")
    ap.add_argument("--state", required=True, metavar="TEXT", help="the request text")
    ap.add_argument("--route-policy", metavar="FILE", help="Laya policy (default: the shipped one)")
    args = ap.parse_args(argv)
    policy = load_policy(args.route_policy, DEVICES[1:])
    model_dir = Path(args.laya_model) if args.laya_model else default_model_dir(
        default_manifest_path(None).parent.parent.parent, os.environ)
    print(classify_main(model_dir, args.state, policy))
    return 0


def check_main(argv: list[str]) -> int:
    """`1bit check`: route self-tests and a device probe of every backend of the installed manifest, as one table."""
    from .check import check, render

    ap = _Parser(prog="1bit check", allow_abbrev=False,
                 description="Check the installed bundle: route rules against its manifest, and what each backend sees.")
    ap.add_argument("--manifest", help=f"bundle manifest (default: the install's; ${MANIFEST_ENV})")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = ap.parse_args(argv)
    manifest = load_manifest(default_manifest_path(args.manifest))
    rows = check(manifest)
    bad = [r.backend for r in rows if not r.ok]
    if args.json:
        import json

        from .check import to_json

        print(json.dumps(to_json(manifest, rows), indent=2))
        return 1 if bad else 0
    render(manifest, rows)
    unproven = [r.backend for r in rows if r.ok and r.unproven]
    if unproven:  # not a failure: nothing can prove (or disprove) these devices; the table's column says why
        print(f"1bit check: {len(unproven)} backend(s) unproven: {', '.join(unproven)}")
    if bad:
        print(f"1bit check: {len(bad)} backend(s) failed: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


def package_version(manifest=None) -> str:
    """The version of this onebit package. Inside a bundle it is the bundle's serve package, installed as plain
    files under <prefix>/lib/onebit/python (no dist-info), built at the bundle's version: the manifest's. From a
    checkout, the installed onebit-build distribution's."""
    from pathlib import Path

    here = Path(__file__).resolve().parent
    if manifest is not None and here.is_relative_to(manifest.prefix.resolve()):
        return manifest.version
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("onebit-build")
    except PackageNotFoundError:
        return "0+unknown"


def version_main(argv: list[str]) -> int:
    """`1bit version`: ONE line, `1bit <version>` (the engine's Lemonade backend reads the version as the text after
    the first space of all of the output). --verbose adds the bundle, its backends and the onebit package."""
    ap = _Parser(prog="1bit version", allow_abbrev=False,
                 description="Print `1bit <version>`: the installed bundle's (or this package's, without one).")
    ap.add_argument("--manifest", help=f"bundle manifest (default: the install's; ${MANIFEST_ENV})")
    ap.add_argument("-v", "--verbose", action="store_true", help="also the bundle, its backends and onebit's version")
    args = ap.parse_args(argv)
    path = default_manifest_path(args.manifest)
    try:
        m = load_manifest(path)
    except ManifestError as e:
        print(f"1bit {package_version()}")
        if args.verbose:
            print(f"bundle: none ({e})")
        return 0
    print(f"1bit {m.version}")
    if args.verbose:
        print(f"bundle {m.bundle} {m.version} (build {m.build_number}, {m.platform}) at {m.prefix}")
        for name, b in sorted(m.backends.items()):
            print(f"  {name} {b.version} {b.commit[:12]}")
        print(f"onebit {package_version(m)}")
    return 0


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    try:
        if cmd == "serve":
            rc = serve_main(rest)
        elif cmd == "version":
            rc = version_main(rest)
        elif cmd == "route":
            rc = route_main(rest)
        elif cmd == "check":
            rc = check_main(rest)
        else:
            rc = None
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        if rc is not None:
            return rc
    except ServeError as e:
        if cmd == "serve":
            refuse(f"1bit serve: error: {e}")
        else:
            print(f"1bit {cmd}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except SystemExit:  # argparse's --help
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _silence_stdout()
        raise
    except BrokenPipeError:
        # `1bit serve --dry-run | head`: the reader left; say nothing more, and keep the interpreter's final
        # flush of stdout from raising again
        _silence_stdout()
        return 141
    print(f"1bit: unknown command {cmd!r}\n{USAGE}", file=sys.stderr, end="")
    return 2


if __name__ == "__main__":
    sys.exit(main())
