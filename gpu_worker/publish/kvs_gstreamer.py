"""GStreamer's kvssink as a Kinesis Video sink: detected, not used (see GStreamerKvsSink)."""

from __future__ import annotations

from typing import Any

from .sinks import Sink, SinkError


def gstreamer_kvssink_available() -> bool:
    """Whether GStreamer (through PyGObject) and the KVS producer SDK's kvssink element are installed."""
    try:
        import gi

        gi.require_version("Gst", "1.0")
        from gi.repository import Gst
    except (ImportError, ValueError):
        return False
    Gst.init(None)
    return Gst.ElementFactory.find("kvssink") is not None


class GStreamerKvsSink(Sink):
    """A placeholder for sending through GStreamer's kvssink (appsrc ! qtdemux ! h264parse ! kvssink).

    Not implemented: kvssink does not hand per-fragment acknowledgements back to the application, so
    acknowledged() could not be truthful and a resume would repeat or skip fragments; and it cannot be tested here.
    KinesisVideoSink has no such dependency. Constructing this raises SinkError saying which of the two applies.
    """

    name = "kvssink"

    def __init__(self, stream_name: str, **properties: Any) -> None:
        if not gstreamer_kvssink_available():
            raise SinkError(
                "GStreamer's kvssink element is not installed (needs PyGObject, GStreamer 1.0 and the KVS "
                "producer SDK's GStreamer plugin); use KinesisVideoSink"
            )
        raise SinkError("GStreamerKvsSink is not implemented (see its docstring); use KinesisVideoSink")

    def start(self, init_segment: bytes, next_index: int) -> None:
        raise SinkError("GStreamerKvsSink is not implemented")

    def put(self, index: int, segment: bytes) -> None:
        raise SinkError("GStreamerKvsSink is not implemented")

    def acknowledged(self) -> int:
        raise SinkError("GStreamerKvsSink is not implemented")

    def finish(self, *, ended: bool) -> None:
        raise SinkError("GStreamerKvsSink is not implemented")

    def close(self) -> None:
        pass
