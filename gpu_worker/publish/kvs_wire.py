"""PutMedia's wire format, apart from the sink's logic: the HTTP/1.1 chunk framing of the request body, the
response body as it arrives, and the stream of JSON acknowledgements inside it (KVS sends them while the request
body is still being written, cut wherever the HTTP chunks fall, with any whitespace between them)."""

from __future__ import annotations

import asyncio
import codecs
import json
from collections.abc import AsyncIterator
from typing import Any

_MAX_ACK_BUFFER = 1 << 16


class ConnectionFailed(Exception):
    """This connection failed in a way a new connection may fix."""


class Fatal(Exception):
    """KVS refused something that retrying cannot fix."""


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode("ascii") + data + b"\r\n"


def ack_number(value: Any) -> int | None:
    """An acknowledgement's number (KVS sends some as JSON numbers, some as strings), None if absent or not one."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class Acknowledgements:
    """Splits the response body into JSON objects, however the HTTP chunks cut it and whatever separates them."""

    def __init__(self) -> None:
        self._text = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._json = json.JSONDecoder()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._text += self._decoder.decode(data)
        found: list[dict[str, Any]] = []
        while True:
            text = self._text.lstrip()
            if not text:
                self._text = ""
                return found
            try:
                value, end = self._json.raw_decode(text)
            except json.JSONDecodeError:  # incomplete: wait for more, within reason
                if len(text) > _MAX_ACK_BUFFER:
                    raise ConnectionFailed(f"unparsable acknowledgement stream: {text[:200]!r}") from None
                self._text = text
                return found
            self._text = text[end:]
            if isinstance(value, dict):
                found.append(value)


async def response_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> AsyncIterator[bytes]:
    """The response body as it arrives; ConnectionFailed if the connection ends before the body does."""
    try:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                line = await reader.readline()
                if not line.endswith(b"\n"):
                    raise ConnectionFailed("the connection dropped in the middle of the response")
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await reader.readline()).strip():  # trailers
                        pass
                    return
                data = await reader.readexactly(size + 2)
                yield data[:-2]
        elif "content-length" in headers:
            yield await reader.readexactly(int(headers["content-length"]))
        else:
            while data := await reader.read(1 << 16):
                yield data
    except asyncio.IncompleteReadError as error:
        raise ConnectionFailed("the connection dropped in the middle of the response") from error
