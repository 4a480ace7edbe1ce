"""A TCP proxy a test can cut, for the partition fault (cli/faults.py): a node reaches Temporal through one, so the
test can cut the node off from the cluster and later let it back in, as a network partition would.

While whole, it relays bytes both ways between each client connection and a fresh connection to the target. `cut`
resets every connection it relays and, until `heal`, resets each new one as soon as it is accepted: the node sees
its connections drop and every reconnect fail, as behind a broken switch. Standard library only; loopback only;
the event loop runs in its own thread, so synchronous tests drive it directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading

RELAY_BUFFER = 1 << 16


class TcpCut:
    """The proxy on a free loopback port (`address`, host:port), forwarding to `target` (host:port)."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._cut = False
        self._open: set[asyncio.StreamWriter] = set()
        self.refused = 0  # connections reset while cut: the node really tried to reach the other side
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-cut", daemon=True)
        self._thread.start()

    def __enter__(self) -> TcpCut:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def is_cut(self) -> bool:
        return self._cut

    def cut(self) -> None:
        """Reset every relayed connection now and every new one until `heal`."""
        asyncio.run_coroutine_threadsafe(self._set_cut(True), self._loop).result()

    def heal(self) -> None:
        asyncio.run_coroutine_threadsafe(self._set_cut(False), self._loop).result()

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            await self._set_cut(True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    async def _set_cut(self, cut: bool) -> None:
        self._cut = cut
        if cut:
            for writer in list(self._open):
                _reset(writer)
            self._open.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            self.refused += 1
            _reset(writer)
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        except OSError:  # the target is down: the client sees what it would see without the proxy
            _reset(writer)
            return
        self._open.update((writer, upstream_writer))
        try:
            await asyncio.gather(_relay(reader, upstream_writer), _relay(upstream_reader, writer))
        finally:
            for end in (writer, upstream_writer):
                self._open.discard(end)
                end.close()


async def _relay(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await source.read(RELAY_BUFFER):
            sink.write(data)
            await sink.drain()
    with contextlib.suppress(OSError):
        if sink.can_write_eof():
            sink.write_eof()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN, as a dropped route looks to the other end."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()
