"""Requests to URLs that callers choose (inputs by URL, webhooks), made so they cannot reach the operator's own
network (server-side request forgery).

What is refused, unless MONOLOGUE_OUTBOUND__ALLOWED_RANGES lists the range (the operator's list always wins):
- a scheme other than https (http too when MONOLOGUE_OUTBOUND__ALLOW_HTTP says so), a user name or password,
  a host that can be no name (a bad IDNA label, a label over 63 characters) and a port outside 1-65535;
- every address in IANA's special-purpose registries for IPv4 and IPv6 (`REFUSED_RANGES`, each with why:
  loopback, private, link-local with the cloud metadata at 169.254.169.254, shared, documentation, benchmarking,
  multicast, reserved, local-use NAT64, unique and site-local), IPv6 outside global unicast (2000::/3), and
  whatever Python's `is_global` also calls non-global;
- IPv6 forms that carry an IPv4 address (IPv4-mapped, IPv4-compatible, 6to4, Teredo, NAT64's 64:ff9b::/96)
  are judged by that IPv4 address, the one a connection ends at;
- a compressed response body (an input of a few kilobytes may inflate to gigabytes): inputs are asked for and
  counted as sent, uncompressed.

The check is on the address connected to, not on the name: httpx's network backend is replaced by one that
resolves the name itself, keeps the allowed addresses and connects to one of them (TLS still verifies the name), so
a name that resolves differently the second time (DNS rebinding) gets nowhere. Redirects are followed by hand, each
hop checked the same way; proxies from the environment are ignored (they would connect for us). A refusal never
names the addresses a name resolved to: that would let a caller map the operator's internal DNS. Bad input of any
kind is a refusal with a message, never another exception.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import urljoin

import httpcore
import httpx

from monologue.errors import AddressRefused, InputError, InputTooLarge
from monologue.settings import OutboundSettings
from monologue.tls import tls_context

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]  # (host, port) → its addresses
RANGES_SETTING = "MONOLOGUE_OUTBOUND__ALLOWED_RANGES"
_REDIRECTS = {301, 302, 303, 307, 308}

# IANA's special-purpose address registries (whole blocks, their few anycast entries included: no input or webhook
# lives there) and the deprecated site-local range. Written out because Python's `is_global` has changed between
# releases (3.11 calls 3fff::/20, 5f00::/16, fec0::/10 and 192.0.0.9 global). IPv6 forms that carry an IPv4
# address (::ffff:0:0/96, ::/96, 2002::/16, 2001::/32 Teredo, 64:ff9b::/96) are not here: their IPv4 decides.
REFUSED_RANGES: tuple[tuple[Network, str], ...] = tuple(
    (ipaddress.ip_network(cidr), why)
    for cidr, why in (
        ("0.0.0.0/8", "this network: 0.0.0.0 reaches the local host"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared address space (carrier-grade NAT)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local, the cloud metadata service among them"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignments (DS-Lite, NAT64 discovery, anycast services)"),
        ("192.0.2.0/24", "documentation (TEST-NET-1)"),
        ("192.88.99.0/24", "6to4 relay anycast, deprecated"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation (TEST-NET-2)"),
        ("203.0.113.0/24", "documentation (TEST-NET-3)"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved, the limited broadcast 255.255.255.255 among them"),
        ("::/128", "unspecified: reaches the local host"),
        ("::1/128", "loopback"),
        ("64:ff9b:1::/48", "local-use NAT64: the operator's own translator, to whatever IPv4 it chooses"),
        ("100::/64", "discard-only"),
        ("2001::/23", "IETF protocol assignments (Teredo, 2001::/32, is judged by its IPv4 addresses)"),
        ("2001:db8::/32", "documentation"),
        ("3fff::/20", "documentation"),
        ("5f00::/16", "segment routing (SRv6) identifiers"),
        ("fc00::/7", "unique local: IPv6's private ranges"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local, deprecated but still routed by some networks"),
        ("ff00::/8", "multicast"),
    )
)
# IANA has handed out only this block as IPv6 global unicast; outside it (less the IPv4 carriers) nothing is public.
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # the well-known prefix: the translator connects to the last 32 bits
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated, the IPv4 address in the last 32 bits


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses the system resolver gives `host` (an IP literal resolves to itself)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def allowed_networks(outbound: OutboundSettings) -> list[Network]:
    """The operator's ranges; ValueError naming the setting for one that is not a CIDR range."""
    networks = []
    for entry in outbound.allowed_ranges:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError as err:
            raise ValueError(
                f"{RANGES_SETTING}: {entry!r} is not an address range such as 10.0.0.0/8 ({err})"
            ) from None
    return networks


def address_allowed(address: str, allowed: Iterable[Network]) -> bool:
    """A public address, or one inside a range the operator allows (for an IPv6 form carrying IPv4 addresses,
    when every one of those is)."""
    allowed = list(allowed)
    ip: Address = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone id names no other address
    if any(ip in network for network in allowed):
        return True
    carried = _carried_ipv4(ip)
    if carried:
        return all(address_allowed(str(inner), allowed) for inner in carried)
    if any(ip in network for network, _ in REFUSED_RANGES):
        return False
    if ip.version == 6 and ip not in _GLOBAL_UNICAST:
        return False
    return ip.is_global  # Python's own list too, in case a registry entry is missing above


def _carried_ipv4(ip: Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses a connection to `ip` ends at when it is an IPv6 form that carries them, else []."""
    if isinstance(ip, ipaddress.IPv4Address):
        return []
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return list(ip.teredo)  # the relay server's and the client's; a packet reaches both
    if ip in _NAT64 or (ip in _IPV4_COMPATIBLE and int(ip) > 1):  # :: and ::1 are themselves, not IPv4
        return [ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)]
    return []


def scheme_refusal(url: str, outbound: OutboundSettings, what: str) -> str | None:
    """Why `url` may not be requested at all (its scheme, user info, a host that can be no name, its port), or
    None."""
    parsed = _parsed(url, what)
    if isinstance(parsed, str):
        return parsed
    schemes = ("https", "http") if outbound.allow_http else ("https",)
    if parsed.scheme not in schemes or not parsed.host:
        allowed = " or ".join(f"{scheme}://" for scheme in schemes)
        return f"{what}: {url!r} must be an {allowed} URL (MONOLOGUE_OUTBOUND__ALLOW_HTTP allows http)"
    if parsed.userinfo:
        return f"{what}: {url!r} carries a user name or password; they are not sent"
    problem = _host_problem(parsed.raw_host.decode("ascii"), parsed.port)
    return None if problem is None else f"{what}: {url!r}: {problem}"


def _parsed(url: str, what: str) -> httpx.URL | str:
    """`url` parsed, or why it cannot be."""
    try:
        parsed = httpx.URL(url)
        _ = parsed.host  # httpx decodes the name's IDNA labels only when asked
    except httpx.InvalidURL as err:
        return f"{what}: {url!r} is not a URL ({err})"
    except UnicodeError as err:  # idna's IDNAError among them: a label that no name may have
        return f"{what}: {url!r}: its host is not a valid name ({err})"
    return parsed


def _host_problem(host: str, port: int | None) -> str | None:
    """Why no connection can go to `host`:`port` (what the resolver would raise on or silently wrap), or None."""
    if port is not None and not 1 <= port <= 65535:
        return f"port must be 1-65535, not {port}"
    labels = host.removesuffix(".").split(".")
    if len(host) > 253 or not all(1 <= len(label) <= 63 for label in labels):
        return "its host is not a valid name (labels of 1-63 characters, 253 in all)"
    return None


def _not_allowed(host: str) -> str:
    # Never the addresses `host` resolved to: a caller could otherwise learn where the operator's internal names
    # point. The host is the caller's own.
    return (
        f"{host} is not an allowed destination: not a public address, and not in a range the operator allows"
        f" ({RANGES_SETTING})"
    )


async def destination_refusal(
    url: str, outbound: OutboundSettings, *, what: str = "url", resolver: Resolver = system_resolver
) -> str | None:
    """A first look at where `url` leads before it is kept (a webhook endpoint): None when its host resolves to at
    least one allowed address, else why not (the scheme checks of `scheme_refusal` included). Each request checks
    again, on the address it connects to."""
    problem = scheme_refusal(url, outbound, what)
    if problem is not None:
        return problem
    parsed = httpx.URL(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        addresses = await resolver(parsed.raw_host.decode("ascii"), port)
    except (OSError, ValueError) as err:  # UnicodeError is a ValueError
        return f"{what}: {parsed.host} does not resolve ({err})"
    allowed = allowed_networks(outbound)
    if not any(address_allowed(address, allowed) for address in addresses):
        return f"{what}: {_not_allowed(parsed.host)}"
    return None


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, connecting only to allowed addresses of a name it resolves itself."""

    def __init__(self, allowed: list[Network], resolver: Resolver = system_resolver) -> None:
        self._allowed = allowed
        self._resolver = resolver
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        problem = _host_problem(host, port)
        if problem is not None:
            raise AddressRefused(f"{host}:{port}: {problem}")
        try:
            addresses = await self._resolver(host, port)
        except (OSError, ValueError) as err:  # UnicodeError is a ValueError
            raise httpcore.ConnectError(f"{host} does not resolve ({err})") from err
        usable = [address for address in addresses if address_allowed(address, self._allowed)]
        if not usable:
            raise AddressRefused(_not_allowed(host))
        failure: Exception = httpcore.ConnectError(f"{host}: no address to connect to")
        for address in usable:
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as err:
                failure = err
        raise failure

    async def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> Any:
        raise AddressRefused("requests to unix sockets are not made")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _GuardedTransport(httpx.AsyncHTTPTransport):
    def __init__(self, backend: GuardedBackend) -> None:
        super().__init__(trust_env=False)
        # httpx builds its pool without a way to pass a network backend: the same pool, with ours.
        self._pool = httpcore.AsyncConnectionPool(ssl_context=tls_context(), network_backend=backend)


def guarded_client(
    outbound: OutboundSettings, *, timeout_s: float, resolver: Resolver = system_resolver
) -> httpx.AsyncClient:
    """An httpx client that connects only where `outbound` allows, follows no redirect, ignores proxies and asks
    for uncompressed bodies (httpx inflates a compressed one whole, whatever its size)."""
    backend = GuardedBackend(allowed_networks(outbound), resolver)
    return httpx.AsyncClient(
        transport=_GuardedTransport(backend),
        timeout=timeout_s,
        follow_redirects=False,
        trust_env=False,
        headers={"accept-encoding": "identity"},
        event_hooks={"response": [_location_check]},
    )


async def _location_check(response: httpx.Response) -> None:
    """httpx reads a redirect's location even when it follows none, and lets IDNA's UnicodeError out of a host
    that can be no name: the RemoteProtocolError it raises for any other location that is no URL, instead."""
    if not response.has_redirect_location:
        return
    try:
        _ = response.request.url.join(response.headers["location"]).host
    except (httpx.InvalidURL, UnicodeError) as err:
        raise httpx.RemoteProtocolError(f"Invalid URL in location header: {err}.", request=response.request) from None


async def fetch(
    url: str,
    *,
    what: str,
    outbound: OutboundSettings,
    limit_bytes: int,
    timeout_s: float,
    max_redirects: int,
    resolver: Resolver = system_resolver,
) -> bytes:
    """GET `url` (redirects followed and checked hop by hop), at most `limit_bytes` as sent, uncompressed, within
    `timeout_s` in all. AddressRefused, InputTooLarge or InputError (what went wrong) name `what` (the form field)."""
    deadline = time.monotonic() + timeout_s
    try:
        async with guarded_client(outbound, timeout_s=timeout_s, resolver=resolver) as client:
            return await asyncio.wait_for(
                _follow(client, url, what, outbound, limit_bytes, max_redirects), timeout=deadline - time.monotonic()
            )
    except TimeoutError:
        raise InputError(
            f"{what}: {url} did not arrive within {timeout_s:g} s (MONOLOGUE_INPUTS__FETCH_TIMEOUT_S)"
        ) from None
    except httpx.HTTPError as err:
        raise InputError(f"{what}: {url} could not be fetched ({type(err).__name__}: {err})") from None


async def _follow(
    client: httpx.AsyncClient, url: str, what: str, outbound: OutboundSettings, limit: int, max_redirects: int
) -> bytes:
    for _ in range(max_redirects + 1):
        problem = scheme_refusal(url, outbound, what)
        if problem is not None:
            raise AddressRefused(problem)
        async with client.stream("GET", url) as response:
            if response.status_code in _REDIRECTS and "location" in response.headers:
                url = urljoin(url, response.headers["location"])  # httpx has refused a location that is no URL
                continue
            if response.status_code != 200:
                raise InputError(f"{what}: {url} answered {response.status_code} {response.reason_phrase}")
            return await _body(response, url, what, limit)
    raise InputError(f"{what}: more than {max_redirects} redirects (MONOLOGUE_INPUTS__MAX_REDIRECTS)")


async def _body(response: httpx.Response, url: str, what: str, limit: int) -> bytes:
    """The body as sent, refused when compressed: its size on the wire says nothing of its size inflated."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise InputError(f"{what}: {url} sent a compressed ({encoding}) body; inputs are fetched uncompressed")
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(what, limit)
    body = bytearray()
    async for block in response.aiter_raw():
        body += block
        if len(body) > limit:
            raise _too_large(what, limit)
    if not body:
        raise InputError(f"{what}: {url} is empty")
    return bytes(body)


def _too_large(what: str, limit: int) -> InputTooLarge:
    return InputTooLarge(f"{what}: larger than the limit of {limit} bytes (setting MONOLOGUE_LIMITS__MAX_UPLOAD_BYTES)")
