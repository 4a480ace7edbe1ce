"""Requests to URLs that callers choose (inputs by URL, webhooks), made so they cannot reach the operator's own
network (server-side request forgery).

Only https (and http when MONOLOGUE_OUTBOUND__ALLOW_HTTP says so), and only public addresses: loopback,
link-local (cloud metadata at 169.254.169.254 among them), private, shared, reserved, multicast and unspecified
ranges, and IPv6 forms that embed them (IPv4-mapped, 6to4), are refused unless MONOLOGUE_OUTBOUND__ALLOWED_RANGES
lists them. The check is on the address connected to, not on the name: httpx's network backend is replaced by one
that resolves the name itself, keeps the allowed addresses and connects to one of them (TLS still verifies the
name), so a name that resolves differently the second time (DNS rebinding) gets nowhere. Redirects are followed
by hand, each hop checked the same way; proxies from the environment are ignored (they would connect for us).
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

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]  # (host, port) → its addresses
RANGES_SETTING = "MONOLOGUE_OUTBOUND__ALLOWED_RANGES"
_REDIRECTS = {301, 302, 303, 307, 308}


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
    """A public address, or one inside a range the operator allows."""
    ip: Address = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone id names no other address
    if any(ip in network for network in allowed):
        return True
    embedded = getattr(ip, "ipv4_mapped", None) or getattr(ip, "sixtofour", None)
    if embedded is not None:
        return address_allowed(str(embedded), allowed)
    return ip.is_global and not ip.is_multicast


def scheme_refusal(url: str, outbound: OutboundSettings, what: str) -> str | None:
    """Why `url` may not be requested at all (its scheme, user info), or None."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as err:
        return f"{what}: {url!r} is not a URL ({err})"
    schemes = ("https", "http") if outbound.allow_http else ("https",)
    if parsed.scheme not in schemes or not parsed.host:
        allowed = " or ".join(f"{scheme}://" for scheme in schemes)
        return f"{what}: {url!r} must be an {allowed} URL (MONOLOGUE_OUTBOUND__ALLOW_HTTP allows http)"
    if parsed.userinfo:
        return f"{what}: {url!r} carries a user name or password; they are not sent"
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
        try:
            addresses = await self._resolver(host, port)
        except OSError as err:
            raise httpcore.ConnectError(f"{host} does not resolve ({err})") from err
        usable = [address for address in addresses if address_allowed(address, self._allowed)]
        if not usable:
            raise AddressRefused(
                f"{host} is {', '.join(addresses) or 'no address'}: not a public address, and not in a range the"
                f" operator allows ({RANGES_SETTING})"
            )
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
        self._pool = httpcore.AsyncConnectionPool(ssl_context=httpx.create_ssl_context(), network_backend=backend)


def guarded_client(
    outbound: OutboundSettings, *, timeout_s: float, resolver: Resolver = system_resolver
) -> httpx.AsyncClient:
    """An httpx client that connects only where `outbound` allows, follows no redirect and ignores proxies."""
    backend = GuardedBackend(allowed_networks(outbound), resolver)
    return httpx.AsyncClient(
        transport=_GuardedTransport(backend), timeout=timeout_s, follow_redirects=False, trust_env=False
    )


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
    """GET `url` (redirects followed and checked hop by hop), at most `limit_bytes`, within `timeout_s` in all.
    AddressRefused, InputTooLarge or InputError (what went wrong) name `what` (the form field)."""
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
                url = urljoin(url, response.headers["location"])
                continue
            if response.status_code != 200:
                raise InputError(f"{what}: {url} answered {response.status_code} {response.reason_phrase}")
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise _too_large(what, limit)
            body = bytearray()
            async for block in response.aiter_bytes():
                body += block
                if len(body) > limit:
                    raise _too_large(what, limit)
            if not body:
                raise InputError(f"{what}: {url} is empty")
            return bytes(body)
    raise InputError(f"{what}: more than {max_redirects} redirects (MONOLOGUE_INPUTS__MAX_REDIRECTS)")


def _too_large(what: str, limit: int) -> InputTooLarge:
    return InputTooLarge(f"{what}: larger than the limit of {limit} bytes (setting MONOLOGUE_LIMITS__MAX_UPLOAD_BYTES)")
