"""A node's warm-up: one throwaway session of a family, run before the node takes any session (node/warm.py), so
that what a session's first chunk would pay on first use is paid here instead.

A fresh node used to build each family's pipeline on its first session (its imports, PocketSphinx's models),
parse OpenCV's cascades on the thread that first encoded a reference, and meet libx264, the AAC encoder and
the frame buffers at its first chunk's size on that chunk: cold costs in the middle of a session, under its
heartbeat timeout. Here they are all met once, on the bundled samples: the family built, a reference encoded,
the first chunk of a default session rendered and encoded into a segment, the init segment written.

What must never happen: anything of the throwaway session reaching a real one. Nothing goes to storage, the
database or Temporal; what persists is only what is meant to (the built pipeline and its reused buffers, the
loaded decoders, the phone-window cache, whose entries are only ever what the decoder would answer again).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from activities.node import stream_format
from activities.pipelines import Pipelines
from gpu_worker.pipeline import ChunkRequest, OutputSpec
from gpu_worker.publish import SegmentWriter, init_segment
from gpu_worker.samples import SPEECH_RATE, sample_portrait, sample_speech
from monologue import contracts as c
from monologue.plan import chunk_sizes, frame_count, plan_timeline

# The session the warm-up runs: new sessions' lip sync (visemes, which loads and runs the phone recogniser), at
# 720p (the largest frames of the usual renders: their buffers and encoder), with enough speech for the first
# chunk and its phone windows' look-ahead.
WARM_RESOLUTION = c.Resolution.HD_720
WARM_SPEECH_S = 4.0


@dataclass(frozen=True)
class Warmed:
    """One family warmed: how long its build and its throwaway session took."""

    family: c.Family
    build_ms: float
    session_ms: float


def warm_family(pipelines: Pipelines, family: c.Family) -> Warmed:
    """Build `family`'s pipeline (kept) and run its throwaway session (dropped): a reference, a first chunk, a
    segment."""
    started = time.perf_counter()
    pipeline = pipelines.get(family)
    built = time.perf_counter()
    options = c.RenderOptions(family=family, resolution=WARM_RESOLUTION, lip_sync=c.LipSync.VISEMES)
    audio = sample_speech(int(WARM_SPEECH_S * SPEECH_RATE))
    session = pipeline.start_session(sample_portrait(), OutputSpec.of(options), audio)
    fmt = stream_format(session)
    init_segment(fmt)
    frames = frame_count(int(WARM_SPEECH_S * SPEECH_RATE), rate=SPEECH_RATE, fps=options.fps)
    first = plan_timeline(frames, **chunk_sizes(options))[0]
    writer = SegmentWriter(fmt, first_frame=first.first_frame, audio=audio)
    pipeline.run_chunk(session, ChunkRequest.of(first, options), writer)
    writer.finish()
    done = time.perf_counter()
    return Warmed(family=family, build_ms=(built - started) * 1000, session_ms=(done - built) * 1000)
