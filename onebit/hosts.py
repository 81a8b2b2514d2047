"""Which addresses serve may bind, and which Host/Origin names the proxy answers. Pure functions, tested by tables.

Binding: a loopback address (127.0.0.0/8, ::1, localhost) is always allowed; anything else (0.0.0.0, ::, a LAN
address, a host name) exposes the server to the network and needs `--allow-remote`.

Host header (DNS-rebinding guard): allowed when it names
  - a loopback address or localhost / *.localhost;
  - the address serve was bound to (unless it is a wildcard: 0.0.0.0 or ::);
  - the local address the request's connection arrived on (so `--host 0.0.0.0` serves LAN clients that use the
    machine's IP: a rebinding attack always sends the attacker's DNS name, never an IP literal of this machine);
  - this machine's names (its hostname, FQDN and hostname.local) when bound to a non-loopback address;
  - a name given with --allowed-host.
Origin header (browser cross-origin guard): absent (not a browser cross-origin request) or an http/https Origin
whose host is allowed by the same rules; any port. So every loopback Origin (http://localhost:3000,
https://127.0.0.1, http://[::1]:8080, http://app.localhost) is allowed: a page served from loopback is already local
code. `null`, file://, other schemes and foreign names are refused.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

WILDCARDS = ("0.0.0.0", "::", "")


def _ip(name: str):
    name = name.strip("[]").split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def normalize_name(name: str) -> str:
    """Lower-case, no brackets, no trailing dot; an IP literal in its canonical form (IPv4-mapped IPv6 as IPv4)."""
    name = name.strip().strip("[]").rstrip(".").lower()
    ip = _ip(name)
    return str(ip) if ip is not None else name


def is_loopback_name(host: str) -> bool:
    host = normalize_name(host)
    if host == "localhost" or host.endswith(".localhost"):
        return True
    ip = _ip(host)
    return ip is not None and ip.is_loopback


def bind_refusal(host: str, allow_remote: bool) -> str | None:
    """None when serve may bind `host`; otherwise the one line that says why not and how to opt in."""
    if allow_remote or (host and is_loopback_name(host)):
        return None
    shown = host or "(empty: every interface)"
    return (f"--host {shown} would expose the server to the network (no authentication); "
            f"add --allow-remote to do this on purpose, or use --host 127.0.0.1")


def static_allowed_names(bind_host: str, machine_names=(), extra=()) -> frozenset[str]:
    """The names the proxy answers to besides loopback and the connection's own local address."""
    names = {normalize_name(n) for n in extra if n and n.strip()}
    if bind_host not in WILDCARDS:
        names.add(normalize_name(bind_host))
    if not is_loopback_name(bind_host or "0.0.0.0"):
        names.update(normalize_name(n) for n in machine_names if n)
    return frozenset(n for n in names if n)


def _host_name(host_header: str) -> str | None:
    h = host_header.strip()
    if h.startswith("["):
        return h[1: h.find("]")] if "]" in h else None
    if h.count(":") > 1:
        return None  # a bare IPv6 literal without brackets is not a valid Host header
    return h.rsplit(":", 1)[0] if ":" in h else h


def host_allowed(host_header: str | None, allowed: frozenset[str] = frozenset()) -> bool:
    if not host_header:
        return False
    name = _host_name(host_header)
    if not name:
        return False
    return is_loopback_name(name) or normalize_name(name) in allowed


def origin_allowed(origin: str | None, allowed: frozenset[str] = frozenset()) -> bool:
    if origin is None:
        return True  # not a browser cross-origin request
    try:
        u = urlsplit(origin.strip())
        hostname = u.hostname
    except ValueError:
        return False
    if u.scheme not in ("http", "https") or not hostname:
        return False  # includes "null" and file://
    return is_loopback_name(hostname) or normalize_name(hostname) in allowed
