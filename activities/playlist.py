"""The HLS playlist of a session, rewritten as segments land (in timeline order); for a session with captions, the
multivariant playlist (`main.m3u8`) that puts the subtitle rendition (`subs.m3u8` over `captions.vtt`) beside it."""

from __future__ import annotations

import math
import re

from gpu_worker.publish import playlist
from gpu_worker.publish.playlist import multivariant_playlist, subtitle_playlist
from monologue import contracts as c, keys
from monologue.captions import CaptionFormat
from monologue.mp4.fragments import read_init
from monologue.plan import IncrementalPlanner, chunk_sizes, plan_timeline, timeline_order
from monologue.storage import ObjectStore

_M3U8 = "application/vnd.apple.mpegurl"


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
    store.put(keys.playlist(session_id), text.encode(), content_type=_M3U8)
    if options.captions is not c.CaptionMode.NONE and entries and total_frames > 0:
        write_captions_rendition(store, session_id, options, total_frames, entries, ended=ended)
    return len(entries)


def write_captions_rendition(
    store: ObjectStore,
    session_id: str,
    options: c.RenderOptions,
    total_frames: int,
    segments: list[tuple[str, float]],
    *,
    ended: bool,
) -> None:
    """The subtitle playlist and the multivariant playlist, after `stream.m3u8` (which they point to). Written at the
    first publish, and again at the end with the peak bandwidth of every segment (HLS wants the peak; the first
    segments only give an estimate, and players use it only to choose among variants, of which there is one)."""
    main = keys.main_playlist(session_id)
    if not ended and store.exists(main):
        return
    subs = subtitle_playlist(_name(keys.captions(session_id, CaptionFormat.VTT)), total_frames / options.fps)
    store.put(keys.subtitle_playlist(session_id), subs.encode(), content_type=_M3U8)
    movie = read_init(store.get(keys.init_segment(session_id)))
    video, audio = movie.track("video"), movie.track("audio")
    bandwidth = max(math.ceil(store.size(keys.output(session_id, name)) * 8 / seconds) for name, seconds in segments)
    text = multivariant_playlist(
        _name(keys.playlist(session_id)),  # relative links: they resolve under whatever path serves main.m3u8
        _name(keys.subtitle_playlist(session_id)),
        language=caption_language(options),
        bandwidth=bandwidth,
        resolution=(video.width, video.height),
        # RFC 6381: avc1.<profile><constraints><level> from the avcC record; mp4a.40.<audio object type>
        codecs=f"{video.codec}.{video.codec_private[1:4].hex()},{audio.codec}.40.{audio.codec_private[0] >> 3}",
    )
    store.put(main, text.encode(), content_type=_M3U8)


def caption_language(options: c.RenderOptions) -> str:
    """The captions' language (BCP 47) for players' track menus: the voice's language for speech synthesised from
    text (`espeak:en-us` → en-US, `piper:de_DE-thorsten-medium` → de-DE), else English."""
    name = options.voice.split(":", 1)[1] if ":" in options.voice else ""
    if not options.text.strip() or not name:
        return "en"
    if options.voice.startswith("piper:"):
        name = name.split("-", 1)[0].replace("_", "-")
    parts = re.split(r"[-+]", name)
    language = parts[0].lower()
    if not re.fullmatch(r"[a-z]{2,3}", language):
        return "en"
    region = parts[1] if len(parts) > 1 and re.fullmatch(r"[A-Za-z]{2}", parts[1]) else ""
    return f"{language}-{region.upper()}" if region else language


def _name(key: str) -> str:
    return key.rsplit("/", 1)[1]
