"""Requests to caller-chosen URLs reach only public addresses or ranges the operator allows (monologue/outbound.py),
checked on the address actually connected to, every redirect hop included; against real servers on loopback."""

from __future__ import annotations

import pytest

from monologue.errors import AddressRefused, InputError, InputTooLarge
from monologue.outbound import address_allowed, allowed_networks, fetch
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
    ],
)
def test_internal_addresses_are_refused_unless_allowed(address: str) -> None:
    assert not address_allowed(address, [])
    assert address_allowed(address, allowed_networks(OutboundSettings(allowed_ranges=["0.0.0.0/0", "::/0"])))


@pytest.mark.parametrize("address", ["93.184.215.14", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert address_allowed(address, [])


def test_an_allowed_range_opens_that_range_only() -> None:
    assert address_allowed("127.0.0.1", LOOPBACK_ONLY)
    assert address_allowed("::ffff:127.0.0.1", LOOPBACK_ONLY)  # the same address, IPv4-mapped
    assert not address_allowed("127.0.0.2", LOOPBACK_ONLY)
    with pytest.raises(ValueError, match="MONOLOGUE_OUTBOUND__ALLOWED_RANGES"):
        allowed_networks(OutboundSettings(allowed_ranges=["not-a-range"]))


async def _fetch(url: str, *, ranges: list[str], resolver: object | None = None, limit: int = 1000) -> bytes:
    settings = OutboundSettings(allowed_ranges=ranges, allow_http=True)
    extra = {} if resolver is None else {"resolver": resolver}
    return await fetch(
        url, what="portrait_url", outbound=settings, limit_bytes=limit, timeout_s=10, max_redirects=3, **extra
    )  # type: ignore[arg-type]


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
        with pytest.raises(AddressRefused, match=r"cdn\.example\.com is 127\.0\.0\.1"):
            await _fetch(url, ranges=[], resolver=resolver)
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
