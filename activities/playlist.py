"""The HLS playlist of a session, rewritten as segments land (in timeline order)."""

from __future__ import annotations

from gpu_worker.publish import playlist
from monologue import contracts as c, keys
from monologue.plan import IncrementalPlanner, chunk_sizes, plan_timeline, timeline_order
from monologue.storage import ObjectStore


def write_playlist(
    store: ObjectStore,
    session_id: str,
    options: c.RenderOptions,
    total_frames: int,
    published_frames: int,
    *,
    ended: bool,
) -> int:
    """Rewrite the HLS playlist with every segment of the timeline that ends by `published_frames`.

    `total_frames` is 0 for a live session whose audio has not ended: the chunks published so far are
    then the ones the incremental plan has emitted by `published_frames` (all full-size)."""
    if total_frames > 0:
        timeline = plan_timeline(total_frames, **chunk_sizes(options))
    else:
        planner = IncrementalPlanner(**chunk_sizes(options))
        timeline = timeline_order(list(planner.advance(published_frames, final=False)))
    entries = [
        (keys.segment_name(spec.kind, spec.index), spec.n_frames / options.fps)
        for spec in timeline
        if spec.end_frame <= published_frames
    ]
    # HLS forbids the target duration changing mid-stream: fix it at the longest chunk there can be.
    longest = max(options.chunk_frames, options.i_frames) / options.fps
    text = playlist(entries, init_uri="init.mp4", ended=ended, target_duration=longest)
    store.put(keys.playlist(session_id), text.encode(), content_type="application/vnd.apple.mpegurl")
    return len(entries)
