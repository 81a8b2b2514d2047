"""install: a bundle from a local channel into a prefix, offline, with py-rattler: the same solve and install a
standard conda client (pixi) does, so `1bit-build install` is a thin front, not a second way in."""
from __future__ import annotations

import asyncio
from pathlib import Path

from ..errors import OnebitError


def host_virtual_packages() -> list:
    """What the solver may assume about this host: exactly what a standard conda client (pixi, mamba, conda) detects,
    __glibc, __cuda, __linux, __unix, __archspec, with conda's CONDA_OVERRIDE_* variables honoured as those clients
    do. Nothing of our own is added: every package of a channel must install with any of those clients."""
    from rattler import VirtualPackage, VirtualPackageOverrides

    return list(VirtualPackage.detect(VirtualPackageOverrides.from_env()))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def install_bundle(channel: Path, prefix: Path, bundle: str, *, cache_dir: Path | None = None,
                   platform: str = "linux-64") -> list[str]:
    import rattler
    from rattler import Channel, ChannelConfig
    from rattler.exceptions import (
        CacheDirError,
        ExtractError,
        FetchRepoDataError,
        GatewayError,
        InstallerError,
        InvalidChannelError,
        IoError,
        LinkError,
        SolverError,
        TransactionError,
    )

    channel = channel.resolve()
    if not (channel / platform / "repodata.json").is_file():
        raise OnebitError(f"{channel} is not a conda channel (no {platform}/repodata.json)",
                          hint="point --channel at the channel/ directory of a built bundle (1bit-build build BUNDLE)")
    spec = f"onebit-bundle-{bundle}"

    async def go() -> list[str]:
        config = ChannelConfig(channel_alias="file:///", root_dir=str(channel.parent))
        source = Channel(channel.as_uri(), config)
        try:
            records = await rattler.solve(sources=[source], specs=[spec], platforms=[platform, "noarch"],
                                          virtual_packages=host_virtual_packages(), timestamp_policy="allow-missing")
        except SolverError as exc:  # the spec cannot be satisfied from this channel
            held = sorted(p.name.removesuffix(".conda") for p in (channel / platform).glob("onebit-bundle-*.conda"))
            raise OnebitError(f"cannot install {spec} from {channel}: {str(exc).strip()}",  # the solver's whole message
                              hint=f"bundles in this channel: {', '.join(held) or 'none'}; is the bundle name right?") from None
        except (GatewayError, FetchRepoDataError, InvalidChannelError) as exc:
            raise OnebitError(f"cannot read the channel {channel}: {_first_line(exc)}",
                              hint="the channel's repodata is unreadable; rebuild it (1bit-build build BUNDLE)") from None
        try:
            await rattler.install(records, target_prefix=str(prefix), cache_dir=str(cache_dir) if cache_dir else None,
                                  show_progress=False)
        except (InstallerError, LinkError, TransactionError, ExtractError, CacheDirError, IoError) as exc:
            raise OnebitError(f"installing {spec} into {prefix} failed: {_first_line(exc)}",
                              hint="check that the prefix and the package cache are writable and the disk has room") from None
        return sorted(f"{r.name.normalized}-{r.version}-{r.build}" for r in records)

    return asyncio.run(go())
