"""`1bit` console script: `1bit serve ...` and `1bit version`."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys

from .errors import ManifestError, ServeError
from .hosts import bind_refusal
from .inspect import inspect_model
from .manifest import MANIFEST_ENV, default_manifest_path, load_manifest
from .recipes import default_recipes_path, load_recipes
from .route import DEVICES, Refusal, RouteEnv, ServeFlags, route

EXIT_REFUSED = 3

USAGE = """usage: 1bit <command> [args]

commands:
  serve     serve a model with the bundle's llama-server (1bit serve -h)
  version   print the bundle and onebit versions
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (and no usage dump)."""

    def error(self, message: str):
        raise ServeError(f"{message} (see {self.prog} -h)")


def _serve_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="1bit serve",
        allow_abbrev=False,
        description="Serve a GGUF model (or 1BP package) with the right backend of this bundle. "
        "Arguments serve does not know are passed to llama-server unchanged.",
    )
    ap.add_argument("-m", "--model", required=True, help="model file (GGUF or 1BP package)")
    ap.add_argument("--device", default="auto", choices=DEVICES, help="backend device (default: auto)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--allow-remote", action="store_true",
                    help="allow a --host that is not loopback (exposes the server to the network)")
    ap.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                    help="proxy mode: another Host/Origin name to answer (e.g. behind a reverse proxy)")
    ap.add_argument("--max-body", type=_size, default=None, metavar="BYTES",
                    help="proxy mode: largest request body (e.g. 64M, 1G; default 256M)")
    ap.add_argument("--port", type=int, default=None, help="public port (default 8080)")
    ap.add_argument("-c", "--ctx-size", type=int, default=None)
    ap.add_argument("-fa", "--flash-attn", nargs="?", const="on", default=None, choices=["on", "off", "auto"])
    ap.add_argument("-a", "--alias", default=None)
    ap.add_argument("-np", "--parallel", type=int, default=None)
    ap.add_argument("--dflash", metavar="DRAFT", help="DFlash drafter GGUF")
    ap.add_argument("--mtp", metavar="HEAD", help="MTP head GGUF")
    ap.add_argument("--mtp-max", type=int)
    ap.add_argument("--mtp-p-min", type=float)
    ap.add_argument("--mmproj", metavar="F")
    ap.add_argument("--moe-slots", type=int, metavar="N", help="vulkan only: keep N experts resident")
    ap.add_argument("--prefill-device", choices=["hrx"], help="prefill on HRX, decode on vulkan")
    ap.add_argument("--prefill-min-tokens", type=int, default=1024)
    ap.add_argument("--long-model", metavar="FILE", help="second model for prompts of --long-from tokens or more")
    ap.add_argument("--long-from", type=int, default=2048)
    ap.add_argument("--adaptive", action="store_true", help="vulkan first, rocm takes the overflow")
    ap.add_argument("--adaptive-at", type=int, default=8)
    ap.add_argument("--laya", metavar="ROUTER", help="(not yet supported)")
    ap.add_argument("--manifest", help=f"bundle manifest (default: the install's share/onebit/manifest.json; ${MANIFEST_ENV})")
    ap.add_argument("--recipes", metavar="FILE", help="serve recipes JSON (default: the bundle's)")
    ap.add_argument("--no-recipes", action="store_true", help="apply no serve recipes")
    ap.add_argument("--llama-server", metavar="PATH", help="llama-server binary (default: $ONEBIT_LLAMA_SERVER, the manifest, PATH)")
    ap.add_argument("--dry-run", action="store_true", help="print the launch plan as JSON and exit")
    return ap


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
    args, extra = _serve_parser().parse_known_args(argv)
    if extra and extra[0] == "--":
        extra = extra[1:]
    flags = ServeFlags(
        model=args.model, device=args.device, host=args.host, port=args.port, ctx_size=args.ctx_size,
        flash_attn=args.flash_attn, alias=args.alias, parallel=args.parallel, dflash=args.dflash, mtp=args.mtp,
        mtp_max=args.mtp_max, mtp_p_min=args.mtp_p_min, mmproj=args.mmproj, moe_slots=args.moe_slots,
        prefill_device=args.prefill_device, prefill_min_tokens=args.prefill_min_tokens,
        long_model=args.long_model, long_from=args.long_from, adaptive=args.adaptive,
        adaptive_at=args.adaptive_at, laya=args.laya, llama_server=args.llama_server, extra=tuple(extra),
    )
    for host in [args.host, *_host_in_extra(extra)]:  # refuse before touching any file
        why = bind_refusal(host, args.allow_remote)
        if why:
            return Refusal(message=why, rule="remote-bind"), args
    if args.laya:
        return route(None, flags, None, RouteEnv()), args
    manifest = _load_manifest_for_serve(args, env)
    facts = inspect_model(args.model)
    draft = inspect_model(args.dflash) if args.dflash else None
    long_facts = inspect_model(args.long_model) if args.long_model else None
    recipes = _recipes(args, manifest)
    from .launch import free_ports

    proxied = bool(args.long_model or args.adaptive)
    renv = RouteEnv(env=env, path_llama_server=shutil.which("llama-server", path=env.get("PATH")),
                    free_ports=free_ports(2) if proxied else ())
    return route(facts, flags, manifest, renv, recipes, draft=draft, long_facts=long_facts), args


def serve_main(argv: list[str]) -> int:
    plan, args = plan_from_args(argv)
    if isinstance(plan, Refusal):
        if args.dry_run:
            print(json.dumps(plan.to_json(), indent=2))
        print(f"1bit serve: refused: {plan.message}", file=sys.stderr)
        return EXIT_REFUSED
    if args.dry_run:
        print(json.dumps(plan.to_json(), indent=2))
        return 0
    from .launch import exec_child, run_proxied

    if plan.mode == "exec":
        exec_child(plan.children[0])  # does not return
        return 1
    return run_proxied(plan, max_body=args.max_body, allowed_hosts=tuple(args.allowed_host))


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("onebit-build")
    except Exception:  # noqa: BLE001
        return "unknown"


def version_main(argv: list[str]) -> int:
    ap = _Parser(prog="1bit version", allow_abbrev=False)
    ap.add_argument("--manifest")
    args = ap.parse_args(argv)
    path = default_manifest_path(args.manifest)
    try:
        m = load_manifest(path)
    except ManifestError as e:
        print(f"onebit {_package_version()}")
        print(f"1bit version: {e}", file=sys.stderr)
        return 1
    print(f"{m.bundle} {m.version} (build {m.build_number}, {m.platform})")
    for name, b in sorted(m.backends.items()):
        print(f"  {name} {b.version} {b.commit[:12]}")
    print(f"onebit {_package_version()}")
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
        else:
            rc = None
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        if rc is not None:
            return rc
    except ServeError as e:
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
