"""ISO BMFF (MP4) box primitives: building boxes from payloads, and walking the boxes of a byte string."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

_HEADER = struct.Struct(">I4s")
_LARGE_SIZE = struct.Struct(">Q")


def box(kind: bytes, *payload: bytes) -> bytes:
    """A box of type `kind` (four bytes) holding the concatenated payloads."""
    if len(kind) != 4:
        raise ValueError(f"box type must be 4 bytes, got {kind!r}")
    body = b"".join(payload)
    return _HEADER.pack(_HEADER.size + len(body), kind) + body


def full_box(kind: bytes, version: int, flags: int, *payload: bytes) -> bytes:
    """A FullBox: a box whose payload starts with a version byte and 24 bits of flags."""
    return box(kind, struct.pack(">I", (version << 24) | flags), *payload)


@dataclass(frozen=True)
class Box:
    """One box found in a buffer: its type and where its payload and the box itself end."""

    kind: bytes
    start: int  # offset of the box header
    payload_start: int
    end: int


def iter_boxes(data: bytes, start: int = 0, end: int | None = None) -> Iterator[Box]:
    """The boxes laid side by side in data[start:end]; ValueError on a box that runs past the end."""
    limit = len(data) if end is None else end
    position = start
    while position < limit:
        if limit - position < _HEADER.size:
            raise ValueError(f"truncated box header at offset {position} (only {limit - position} bytes left)")
        size, kind = _HEADER.unpack_from(data, position)
        payload_start = position + _HEADER.size
        if size == 1:
            (size,) = _LARGE_SIZE.unpack_from(data, payload_start)
            payload_start += _LARGE_SIZE.size
        elif size == 0:  # "extends to the end of the file"
            size = limit - position
        if size < payload_start - position or position + size > limit:
            raise ValueError(f"box {kind!r} at offset {position} has size {size}, past the end ({limit})")
        yield Box(kind, position, payload_start, position + size)
        position += size


def child(data: bytes, parent: Box, kind: bytes) -> Box:
    """The first box of type `kind` directly inside `parent`; ValueError if it has none."""
    for found in iter_boxes(data, parent.payload_start, parent.end):
        if found.kind == kind:
            return found
    raise ValueError(f"box {parent.kind!r} at offset {parent.start} has no {kind!r} box")


def read_box(stream: BinaryIO) -> tuple[bytes, int, bytes] | None:
    """The next box header from a file: (type, total size, header bytes), or None at the end of the file."""
    header = stream.read(_HEADER.size)
    if not header:
        return None
    if len(header) < _HEADER.size:
        raise ValueError(f"truncated box header ({len(header)} bytes)")
    size, kind = _HEADER.unpack(header)
    if size == 1:
        extra = stream.read(_LARGE_SIZE.size)
        if len(extra) < _LARGE_SIZE.size:
            raise ValueError(f"truncated large size of box {kind!r}")
        header += extra
        (size,) = _LARGE_SIZE.unpack(extra)
    if size < len(header):
        raise ValueError(f"box {kind!r} has an impossible size {size} (0 = to end of file is not supported here)")
    return kind, size, header
