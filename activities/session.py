"""Activities on the shared queue: checking a session's stored inputs, handing it to a node, ending a live
session's stored audio, and recording failures. Any node process can run them."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import sessionmaker
from temporalio import activity

from activities.errors import activity_context
from activities.playlist import write_playlist
from monologue import contracts as c, keys, metrics, repo
from monologue.errors import InputError
from monologue.live_audio import LiveAudioWriter, stored_live_audio
from monologue.media import AUDIO_RATE, StoredWav, decode_png
from monologue.plan import chunk_sizes, frame_count, plan_chunks, plan_timeline
from monologue.storage import ObjectStore


class SessionActivities:
    def __init__(self, *, store: ObjectStore, sessions: sessionmaker[Any]) -> None:
        self._store = store
        self._sessions = sessions

    @activity.defn(name=c.PREPARE)
    def prepare(self, request: c.PrepareInput) -> c.PrepareResult:
        """Check the normalised inputs the API stored and size the timeline."""
        with activity_context(session_id=request.session_id) as log:
            portrait = decode_png(self._store.get(keys.portrait(request.session_id)))
            audio = StoredWav(self._store, keys.audio(request.session_id))  # reads the header only
            samples = audio.total_samples or 0
            options = request.options
            frames = frame_count(samples, rate=AUDIO_RATE, fps=options.fps)
            if frames < 1:
                raise InputError(f"audio: {samples} samples is shorter than one frame at {options.fps} fps")
            chunks = len(plan_chunks(frames, **chunk_sizes(options)))
            with self._sessions() as db:
                repo.mark_running(db, session_id=request.session_id, frames=frames, chunks_total=chunks)
            log.info("prepared", frames=frames, chunks=chunks, audio_samples=samples)
            return c.PrepareResult(
                frames=frames, audio_samples=samples, width=portrait.shape[1], height=portrait.shape[0]
            )

    @activity.defn(name=c.PUBLISH)
    def publish(self, request: c.PublishInput) -> c.PublishResult:
        """Append the segments that are now contiguous from the start to the HLS playlist."""
        with activity_context(session_id=request.session_id) as log:
            count = write_playlist(
                self._store,
                request.session_id,
                request.options,
                request.total_frames,
                request.published_frames,
                ended=request.ended,
            )
            with self._sessions() as db:
                published = repo.mark_published(
                    db, session_id=request.session_id, published_frames=request.published_frames
                )
            for wait_ms in published.new_waits_ms:
                metrics.LIVE_LATENCY.observe(wait_ms / 1000)
            if published.ttff_ms is not None:
                metrics.TTFF.labels(kind=c.SessionKind.LIVE.value).observe(published.ttff_ms / 1000)
            log.info("published", segments=count, frames=request.published_frames, latency=published.latency)
            return c.PublishResult(segments=count)

    @activity.defn(name=c.RECORD_STATUS)
    def record_status(self, request: c.RecordStatusInput) -> None:
        """The session ended without a video (failed or cancelled): close its stream and record why.

        The rule: the closed stream holds every chunk already generated, from the start of the timeline without a
        gap. The workflow's own count (`published_frames`) can lag the database: a chunk the node finished and
        recorded just as the cancel came is stored but not yet heard of, and must not be dropped."""
        with activity_context(session_id=request.session_id) as log:
            published = self._generated_frames(request)
            if request.total_frames > 0 or (request.session_kind == c.SessionKind.LIVE and published > 0):
                # what was published stays playable: the playlist gets its ENDLIST
                write_playlist(
                    self._store, request.session_id, request.options, request.total_frames, published, ended=True
                )
            with self._sessions() as db:
                ended = repo.mark_ended(db, session_id=request.session_id, status=request.status, error=request.error)
            if not ended:  # a terminal status is never overwritten: the first to end the session wins
                log.warning("session had already ended", status=request.status, error=request.error)
                return
            log.warning("session ended", status=request.status, error=request.error)

    def _generated_frames(self, request: c.RecordStatusInput) -> int:
        """Frames from the timeline's start whose chunks are all generated: what the workflow heard of, or more where
        the database records more (a render's timeline is known; a live one's ends where the workflow heard)."""
        if request.total_frames <= 0:
            return request.published_frames
        with self._sessions() as db:
            done = repo.generated_chunks(db, session_id=request.session_id)
        frames = 0
        for spec in plan_timeline(request.total_frames, **chunk_sizes(request.options)):
            if (spec.kind, spec.index) not in done:
                break
            frames = spec.end_frame
        return max(request.published_frames, frames)

    @activity.defn(name=c.STORED_AUDIO)
    def stored_audio(self, request: c.StoredAudioInput) -> c.StoredAudioResult:
        """A live session's audio as storage holds it, ended there: the workflow ended it itself (idle timeout
        or lifetime), so no API did, and one that comes back late must find it closed. Idempotent: a retry
        finds the end marker and reports the same total."""
        with activity_context(session_id=request.session_id) as log:
            samples, ended = stored_live_audio(self._store, request.session_id)
            if not ended:
                LiveAudioWriter.mark_ended(self._store, request.session_id, samples)
            log.info("live audio ended by the workflow", samples=samples, already_ended=ended)
            return c.StoredAudioResult(samples=samples)
