"""Requests to caller-chosen URLs reach only public addresses or ranges the operator allows (monologue/outbound.py),
checked on the address actually connected to, every redirect hop included; against real servers on loopback."""

from __future__ import annotations

import contextlib
import socket
import tracemalloc
import zlib

import httpx
import pytest

from monologue.errors import AddressRefused, InputError, InputTooLarge
from monologue.outbound import (
    REFUSED_RANGES,
    Network,
    Resolver,
    address_allowed,
    allowed_networks,
    destination_refusal,
    fetch,
    guarded_client,
    scheme_refusal,
    system_resolver,
)
from monologue.settings import OutboundSettings
from tests.local_server import Answer, LocalServer

LOOPBACK_ONLY = allowed_networks(OutboundSettings(allowed_ranges=["127.0.0.1/32"]))


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",  # loopback
        "::1",
        "169.254.169.254",  # cloud metadata (link-local)
        "fe80::1",
        "10.1.2.3",  # private
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",  # carrier-grade NAT
        "0.0.0.0",
        "224.0.0.1",  # multicast
        "::ffff:127.0.0.1",  # IPv4-mapped loopback
        "::ffff:169.254.169.254",
        "2002:7f00:1::",  # 6to4 around 127.0.0.1
        "fc00::1",  # unique local
        "fe80::1%eth0",  # link-local with a zone id
        "::",  # unspecified
        "::7f00:1",  # IPv4-compatible around 127.0.0.1
        "::a9fe:a9fe",  # IPv4-compatible around 169.254.169.254
        "::ffff:0:7f00:1",  # IPv4-translated around 127.0.0.1 (no global unicast)
        "64:ff9b::7f00:1",  # NAT64 well-known prefix around 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 around the cloud metadata address
        "64:ff9b:1::808:808",  # local-use NAT64: refused whatever it carries
        "2001:0:808:808::80ff:fffe",  # Teredo: server 8.8.8.8, client 127.0.0.1
        "2001:0:a00:1::f7f7:f7f7",  # Teredo: server 10.0.0.1, client 8.8.8.8
        "fec0::1",  # site-local
        "192.0.0.8",  # IETF protocol assignments (192.0.0.0/24)
        "192.0.0.9",
        "192.0.2.1",  # documentation
        "192.88.99.1",  # 6to4 relay anycast
        "198.18.0.1",  # benchmarking
        "198.51.100.1",
        "203.0.113.1",
        "240.0.0.1",  # reserved
        "255.255.255.255",  # limited broadcast
        "100::1",  # discard-only
        "2001:2::1",  # IETF protocol assignments (2001::/23)
        "2001:db8::1",  # documentation
        "3fff::1",
        "5f00::1",  # segment routing
        "ff02::1",  # multicast
    ],
)
def test_internal_addresses_are_refused_unless_allowed(address: str) -> None:
    assert not address_allowed(address, [])
    assert address_allowed(address, allowed_networks(OutboundSettings(allowed_ranges=["0.0.0.0/0", "::/0"])))


@pytest.mark.parametrize(
    "address",
    [
        "93.184.215.14",
        "8.8.8.8",
        "2606:4700:4700::1111",
        "2001:4860:4860::8888",
        "::ffff:8.8.8.8",  # IPv4-mapped, 6to4, NAT64 and Teredo forms of public addresses
        "2002:808:808::1",
        "64:ff9b::808:808",
        "2001:0:808:808::fefe:fefe",  # Teredo: server 8.8.8.8, client 1.1.1.1
    ],
)
def test_public_addresses_are_allowed(address: str) -> None:
    assert address_allowed(address, [])


@pytest.mark.parametrize(("network", "why"), REFUSED_RANGES, ids=[str(network) for network, _ in REFUSED_RANGES])
def test_every_refused_range_is_refused_end_to_end_unless_allowed(network: Network, why: str) -> None:
    """No row of the table is shadowed (by an IPv4 carrier's unwrapping, say): its first and last addresses are
    refused, and allowed once the operator lists the range."""
    for address in (network.network_address, network.broadcast_address):
        assert not address_allowed(str(address), []), (address, why)
        assert address_allowed(str(address), [network]), (address, why)


def test_an_allowed_range_opens_that_range_only() -> None:
    assert address_allowed("127.0.0.1", LOOPBACK_ONLY)
    assert address_allowed("::ffff:127.0.0.1", LOOPBACK_ONLY)  # the same address, IPv4-mapped
    assert not address_allowed("127.0.0.2", LOOPBACK_ONLY)
    for carrier in ("::7f00:1", "64:ff9b::7f00:1", "2002:7f00:1::", "2001:0:808:808::80ff:fffe"):
        assert address_allowed(carrier, LOOPBACK_ONLY)  # 127.0.0.1 inside IPv6: the operator's range still wins
    assert address_allowed("fec0::1", allowed_networks(OutboundSettings(allowed_ranges=["fec0::/10"])))
    with pytest.raises(ValueError, match="MONOLOGUE_OUTBOUND__ALLOWED_RANGES"):
        allowed_networks(OutboundSettings(allowed_ranges=["not-a-range"]))


async def _fetch(url: str, *, ranges: list[str], resolver: Resolver = system_resolver, limit: int = 1000) -> bytes:
    settings = OutboundSettings(allowed_ranges=ranges, allow_http=True)
    return await fetch(
        url,
        what="portrait_url",
        outbound=settings,
        limit_bytes=limit,
        timeout_s=10,
        max_redirects=3,
        resolver=resolver,
    )


async def test_a_loopback_server_is_refused_unless_its_range_is_allowed() -> None:
    with LocalServer("127.0.0.1") as server:
        server.routes["/face.jpg"] = Answer(body=b"jpeg bytes")
        with pytest.raises(AddressRefused, match=r"127\.0\.0\.1.*MONOLOGUE_OUTBOUND__ALLOWED_RANGES"):
            await _fetch(server.url("/face.jpg"), ranges=[])
        assert server.received == []  # refused before connecting
        assert await _fetch(server.url("/face.jpg"), ranges=["127.0.0.1/32"]) == b"jpeg bytes"


async def test_a_redirect_to_a_refused_address_is_refused() -> None:
    with LocalServer("127.0.0.1") as allowed, LocalServer("127.0.0.2") as internal:
        internal.routes["/secret"] = Answer(body=b"internal")
        allowed.routes["/face.jpg"] = Answer(302, headers={"Location": internal.url("/secret")})
        allowed.routes["/hop"] = Answer(307, headers={"Location": "/face2.jpg"})
        allowed.routes["/face2.jpg"] = Answer(body=b"second hop")
        with pytest.raises(AddressRefused, match=r"127\.0\.0\.2"):
            await _fetch(allowed.url("/face.jpg"), ranges=["127.0.0.1/32"])
        assert internal.received == []
        assert await _fetch(allowed.url("/hop"), ranges=["127.0.0.1/32"]) == b"second hop"  # a relative redirect


async def test_the_address_checked_is_the_one_connected_to() -> None:
    """A name resolves (here, by an injected resolver) to loopback: refused without the range, although the name
    looks public; with the range, the request goes to that very address."""
    with LocalServer("127.0.0.1") as server:
        server.routes["/a"] = Answer(body=b"resolved")

        async def resolver(host: str, port: int) -> list[str]:
            assert host == "cdn.example.com"
            return ["127.0.0.1"]

        url = f"http://cdn.example.com:{server.port}/a"
        with pytest.raises(AddressRefused, match=r"cdn\.example\.com is not an allowed destination") as refused:
            await _fetch(url, ranges=[], resolver=resolver)
        assert "127.0.0.1" not in str(refused.value)  # where an internal name points is not told
        assert await _fetch(url, ranges=["127.0.0.1/32"], resolver=resolver) == b"resolved"
        assert server.received[-1].headers["host"] == f"cdn.example.com:{server.port}"


async def test_size_scheme_and_status_are_checked() -> None:
    with LocalServer("127.0.0.1") as server:
        server.routes["/big"] = Answer(body=b"x" * 2000)
        with pytest.raises(InputTooLarge, match="MONOLOGUE_LIMITS__MAX_UPLOAD_BYTES"):
            await _fetch(server.url("/big"), ranges=["127.0.0.1/32"])
        with pytest.raises(InputError, match="404"):
            await _fetch(server.url("/missing"), ranges=["127.0.0.1/32"])
        settings = OutboundSettings(allowed_ranges=["127.0.0.1/32"])  # http not allowed
        with pytest.raises(AddressRefused, match="https://"):
            await fetch(
                server.url("/big"), what="audio_url", outbound=settings, limit_bytes=9, timeout_s=5, max_redirects=0
            )
    with pytest.raises(AddressRefused, match="https://"):
        await _fetch("file:///etc/passwd", ranges=[])


BAD_HOSTS_AND_PORTS = [
    ("https://xn--a.com/", "host is not a valid name"),  # a punycode label that decodes to nothing allowed
    (f"https://{'a' * 64}.com/", "host is not a valid name"),  # a label over 63 characters
    (f"https://{'a' * 63}.{'b' * 63}.{'c' * 63}.{'d' * 63}.com/", "host is not a valid name"),  # over 253 in all
    ("https://a..example.com/", "host is not a valid name"),  # an empty label
    ("https://example.com:99999/", "port must be 1-65535"),  # the resolver would wrap it to 34463
    ("https://example.com:0/", "port must be 1-65535"),
]
BAD_IDS = ["idna", "label-over-63", "name-over-253", "empty-label", "port-99999", "port-0"]


@pytest.mark.parametrize(("url", "problem"), BAD_HOSTS_AND_PORTS, ids=BAD_IDS)
def test_a_host_that_can_be_no_name_or_a_bad_port_is_refused_with_a_message(url: str, problem: str) -> None:
    """Today's exceptions from IDNA and the resolver (a 500) become a refusal naming the field (a 422)."""
    refusal = scheme_refusal(url, OutboundSettings(), "portrait_url")
    assert refusal is not None and refusal.startswith("portrait_url: ") and problem in refusal


async def _never_resolved(host: str, port: int) -> list[str]:
    raise AssertionError(f"{host}:{port} should have been refused before it was resolved")


@pytest.mark.parametrize(("url", "problem"), BAD_HOSTS_AND_PORTS, ids=BAD_IDS)
async def test_fetch_and_the_destination_check_refuse_a_bad_host_or_port_before_resolving(
    url: str, problem: str
) -> None:
    with pytest.raises(AddressRefused, match=problem):
        await _fetch(url.replace("https://", "http://"), ranges=[], resolver=_never_resolved)
    refusal = await destination_refusal(url, OutboundSettings(), resolver=_never_resolved)
    assert refusal is not None and refusal.startswith("url: ") and problem in refusal


@pytest.mark.parametrize(
    ("location", "refused"),
    [
        ("http://[::1/face.jpg", "Invalid URL in location header"),  # no URL (httpx's own message)
        ("http://xn--a.com/face.jpg", "Invalid URL in location header"),  # IDNA that httpx raised UnicodeError on
        ("//xn--a.com/face.jpg", "Invalid URL in location header"),
        ("http://a..example.com/face.jpg", "host is not a valid name"),  # the next hop's own check
    ],
)
async def test_a_redirect_to_no_url_or_to_a_host_that_can_be_no_name_is_refused_with_a_message(
    location: str, refused: str
) -> None:
    async def loopback_only(host: str, port: int) -> list[str]:
        assert host == "127.0.0.1", f"{host} should have been refused before it was resolved"
        return [host]

    with LocalServer("127.0.0.1") as server:
        server.routes["/moved"] = Answer(302, headers={"Location": location})
        with pytest.raises(InputError, match=refused):
            await _fetch(server.url("/moved"), ranges=["127.0.0.1/32"], resolver=loopback_only)
        outbound = OutboundSettings(allowed_ranges=["127.0.0.1/32"], allow_http=True)
        async with guarded_client(outbound, timeout_s=5) as client:  # as a webhook delivery uses it
            with contextlib.suppress(httpx.HTTPError):  # recorded as a failed attempt; anything else escapes it
                await client.post(server.url("/moved"), content=b"{}")


async def test_a_resolver_that_chokes_on_a_name_is_a_connect_error() -> None:
    """The guarded client used directly (webhook deliveries): what the resolver raises, UnicodeError included, is
    httpx's ConnectError, which callers already handle."""

    async def choking(host: str, port: int) -> list[str]:
        raise UnicodeError("label empty or too long")

    async with guarded_client(OutboundSettings(allow_http=True), timeout_s=5, resolver=choking) as client:
        with pytest.raises(httpx.ConnectError, match="does not resolve"):
            await client.get("http://hooks.example.com/")


def _resolving_to(*addresses: str) -> Resolver:
    async def resolver(host: str, port: int) -> list[str]:
        assert (host, port) == ("hooks.example.com", 443)
        return list(addresses)

    return resolver


async def test_destination_refusal_allows_a_host_with_an_allowed_address_and_names_no_address() -> None:
    """A webhook endpoint's first look: allowed when any address its host resolves to is; refused without
    telling the caller where an internal name points."""
    url, outbound = "https://hooks.example.com/in", OutboundSettings()
    assert await destination_refusal(url, outbound, resolver=_resolving_to("8.8.8.8")) is None
    assert await destination_refusal(url, outbound, resolver=_resolving_to("10.0.0.7", "8.8.8.8")) is None
    refusal = await destination_refusal(url, outbound, what="endpoint", resolver=_resolving_to("10.0.0.7", "::1"))
    assert refusal == (
        "endpoint: hooks.example.com is not an allowed destination: not a public address, and not in a range the"
        " operator allows (MONOLOGUE_OUTBOUND__ALLOWED_RANGES)"
    )
    inside = OutboundSettings(allowed_ranges=["10.0.0.0/24"])
    assert await destination_refusal(url, inside, resolver=_resolving_to("10.0.0.7")) is None
    assert "https://" in str(await destination_refusal("http://hooks.example.com/", outbound))  # before resolving


async def test_destination_refusal_with_the_system_resolver() -> None:
    """localhost resolves (from the hosts file) to loopback: refused, and neither 127.0.0.1 nor ::1 is told; a
    name that does not resolve says so."""
    refusal = await destination_refusal("https://localhost:8443/hook", OutboundSettings())
    assert refusal is not None and "localhost is not an allowed destination" in refusal
    assert "127.0.0.1" not in refusal and "::1" not in refusal
    assert (
        await destination_refusal("https://localhost:8443/hook", OutboundSettings(allowed_ranges=["127.0.0.0/8"]))
        is None
    )

    async def unknown(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    refusal = await destination_refusal("https://nowhere.example/", OutboundSettings(), resolver=unknown)
    assert refusal is not None and refusal.startswith("url: nowhere.example does not resolve")


def _gzip_of_zeros(size: int) -> bytes:
    """A gzip body of `size` zero bytes (about a thousandth of that on the wire), made a MiB at a time."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip wrapper
    block = bytes(1 << 20)
    return b"".join(packer.compress(block) for _ in range(size >> 20)) + packer.flush()


async def test_a_compressed_body_is_refused_before_it_is_inflated() -> None:
    """A gzip bomb small on the wire (128 MiB of zeros in ~130 kB, under the limit): asked for uncompressed and
    refused when sent compressed anyway, with memory nowhere near the inflated size (httpx inflates each 64 KiB
    read whole, ~64 MiB, before any size check)."""
    decoded = 128 << 20
    bomb = _gzip_of_zeros(decoded)
    with LocalServer("127.0.0.1") as server:
        server.routes["/bomb.wav"] = Answer(body=bomb, headers={"Content-Encoding": "gzip"})
        server.routes["/plain.wav"] = Answer(body=b"riff bytes", headers={"Content-Encoding": "identity"})
        tracemalloc.start()
        try:
            with pytest.raises(InputError, match=r"sent a compressed \(gzip\) body; inputs are fetched uncompressed"):
                await _fetch(server.url("/bomb.wav"), ranges=["127.0.0.1/32"], limit=1 << 20)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 8 << 20, f"{peak} bytes at the peak"
        assert server.received[-1].headers["accept-encoding"] == "identity"
        assert await _fetch(server.url("/plain.wav"), ranges=["127.0.0.1/32"]) == b"riff bytes"
