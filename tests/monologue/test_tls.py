"""Outgoing clients share one TLS context: a call to Janus or a signalling request to a node reads no CA bundle (it
cost ~30 ms of CPU per request, several per viewer that connects)."""

from __future__ import annotations

import asyncio
import json
import ssl

import pytest

from api.webrtc import forward
from monologue.janus import Janus
from monologue.tls import tls_context
from tests.local_server import Answer, LocalServer


def test_requests_to_janus_and_to_nodes_build_no_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    tls_context()  # the process's one, built before counting
    loads: list[object] = []
    original = ssl.SSLContext.load_verify_locations

    def counted(self: ssl.SSLContext, *args: object, **kwargs: object) -> None:
        loads.append(args)
        original(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    with LocalServer() as server:
        server.routes["/janus"] = Answer(body=json.dumps({"janus": "success", "data": {"id": 7}}).encode())
        server.routes["/whep"] = Answer(201, b"v=0")

        async def requests() -> list[object]:
            janus = Janus(server.url("/janus"))
            created = await janus.call("", {"janus": "create"})
            return [created, (await forward("POST", server.url("/whep"), body="x")).text]

        answers = asyncio.run(requests())
    assert answers == [{"janus": "success", "data": {"id": 7}}, "v=0"]
    assert loads == []  # without the shared context, each client read certifi's bundle
    assert tls_context() is tls_context()
