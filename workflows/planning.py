"""A session's chunk plan inside RenderWorkflow: fixed for a render, growing with the audio for a live session.

Live sessions learn about their audio from AUDIO_AVAILABLE signals (AudioFeed) and plan the chunks it makes
possible; no audio for the idle timeout, or the end of the session's lifetime, ends the audio at what storage
holds (the `stored_audio` activity: the API may have stored audio it never signalled). Workflow code: no I/O or
clocks but Temporal's, standard library, temporalio and the stdlib-only contracts and plan only."""

from __future__ import annotations

from collections import deque
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from workflows.shared import SHORT, run_shared

with workflow.unsafe.imports_passed_through():
    from monologue import contracts as c
    from monologue.contracts import Chunk
    from monologue.plan import (
        IncrementalPlanner,
        chunk_sizes,
        live_frames,
        live_samples_needed,
        timeline_order,
    )

LIFETIME_OVER = "live session reached its lifetime: ending it"
IDLE = "live session idle: ending it"
# Sessions that ended their audio by timer before this patch planned from the signalled samples alone; their
# histories have no `stored_audio` activity, so they must not get one on replay.
STORED_AUDIO_PATCH = "stored-audio-at-idle-end"


class AudioFeed:
    """A live session's stored audio, as the API's signals report it (they may repeat or arrive late: the
    maximum counts). Exists before the run starts, because a signal may come in first."""

    def __init__(self) -> None:
        self.samples, self.ended = 0, False
        self.news = False  # the audio grew (or ended) since the plan last looked
        self.marks: deque[tuple[int, float]] = deque()  # (samples stored, when: API epoch ms)
        # Set once the audio has ended and the last chunks are planned (sessions with a lifetime only, so that
        # older histories replay): audio signalled later (the API still sending) is not part of the session.
        self.closed = False

    def receive(self, audio: c.AudioAvailable) -> None:
        if self.closed:
            return
        for samples, received_ms in audio.marks:
            self.marks.append((int(samples), received_ms))
        if audio.samples > self.samples or (audio.ended and not self.ended):
            self.samples = max(self.samples, audio.samples)
            self.ended = self.ended or audio.ended
            self.news = True


class SessionPlan:
    """The chunks of a session in generation order (`chunks`) and in timeline order (`timeline`); chunks are
    only ever appended, and newly planned ones always come after the planned ones in timeline order."""

    def __init__(self, request: c.RenderInput, feed: AudioFeed, progress: c.Progress) -> None:
        self._request, self._feed, self._progress = request, feed, progress
        self._live = request.kind == c.SessionKind.LIVE
        self.live_since_ms = request.resume.live_since_ms  # the first run's start (set by `run`: Temporal's clock)
        self.frames = request.resume.frames  # the timeline's length, once known
        self.chunks: list[Chunk] = []
        self.timeline: list[Chunk] = []
        self.audio_ready: dict[str, float] = {}  # planned live chunks: when their audio was stored (epoch ms)
        self._planner = IncrementalPlanner(**chunk_sizes(request.options))

    @property
    def planned_all(self) -> bool:
        return self._planner.finished

    def start(self) -> None:
        """The first chunks: all of a render's (its frames known), or what a live session's audio allows."""
        resume, feed = self._request.resume, self._feed
        if not self._live:
            feed.samples, feed.ended = 0, True
            self.extend(frames=self.frames)
            return
        if resume.audio_ended and self._request.orchestration.max_live_s > 0:
            feed.samples, feed.ended = resume.audio_samples, True  # ended before this run: later signals don't count
        else:
            feed.samples = max(feed.samples, resume.audio_samples)  # a signal may have come in first
            feed.ended = feed.ended or resume.audio_ended
        self.extend()

    def extend(self, frames: int | None = None) -> None:
        """Add the chunks the audio stored so far makes possible (all of them once it has ended)."""
        feed = self._feed
        if frames is None:
            frames = live_frames(feed.samples, self._request.options, ended=feed.ended)
            if feed.ended:
                if frames < 1:
                    raise ApplicationError(
                        f"live session {self._request.session_id} ended with no audio"
                        f" ({feed.samples} samples is less than one frame)",
                        non_retryable=True,
                    )
                self.frames = frames
        new = list(self._planner.advance(frames, final=feed.ended))
        if self._live:
            self._note_audio_ready(new)
            feed.closed = feed.ended and self._request.orchestration.max_live_s > 0
        self.chunks.extend(new)
        self.timeline.extend(timeline_order(new))
        self._progress.chunks_total = len(self.chunks) if self.planned_all else 0

    async def end_audio(self, reason: str) -> None:
        """No more audio (idle timeout or lifetime, not an `ended` signal): plan the session's last chunks from
        what is stored. The API acknowledges audio to its client once stored but signals only about once a
        chunk, so after an API crash storage holds more than the last signal said: the larger counts."""
        feed = self._feed
        if workflow.patched(STORED_AUDIO_PATCH):
            signalled = feed.samples  # a signal during the call is audio stored after the end marker: not counted
            ask = c.StoredAudioInput(session_id=self._request.session_id)
            stored = await run_shared(c.STORED_AUDIO, ask, c.StoredAudioResult, SHORT)
            feed.samples = max(signalled, stored.samples)
        workflow.logger.info(reason, extra={"session_id": self._request.session_id, "samples": feed.samples})
        feed.ended = True
        self.extend()

    async def wait_for_audio(self) -> None:
        """Wait for a live session's next audio; none for the idle timeout, or the end of its lifetime, ends
        the session with the audio it has."""
        timeout_s = self._request.orchestration.idle_timeout_s
        lifetime_left_s = self.lifetime_left_s()
        if lifetime_left_s is not None:
            timeout_s = min(timeout_s, lifetime_left_s)
        try:
            await workflow.wait_condition(lambda: self._feed.news, timeout=timedelta(seconds=timeout_s))
        except TimeoutError:  # the builtin: wait_condition's timeout
            await self.end_audio(LIFETIME_OVER if self.lifetime_over() else IDLE)

    def lifetime_left_s(self) -> float | None:
        """Seconds a live session has left before its lifetime ends it; None without a lifetime (a render, a
        session whose audio has ended, or one started before lifetimes existed). Temporal's clock: replays agree."""
        max_live_s = self._request.orchestration.max_live_s
        if not self._live or max_live_s <= 0 or self._feed.ended:
            return None
        lived_s = (workflow.now().timestamp() * 1000 - self.live_since_ms) / 1000
        return max_live_s - lived_s

    def lifetime_over(self) -> bool:
        left_s = self.lifetime_left_s()
        return left_s is not None and left_s <= 0

    def _note_audio_ready(self, new: list[Chunk]) -> None:
        """When the API had stored the audio each newly planned live chunk needs (its frames and the
        look-ahead): the first arrival mark that covers it. Marks before the newest are then dropped: later
        chunks need more audio than these."""
        marks = self._feed.marks
        for spec in new:
            needed = live_samples_needed(spec.end_frame, self._request.options)
            ready = next((ms for samples, ms in marks if samples >= needed), None)
            if ready is None and marks:
                ready = marks[-1][1]  # the last chunks of an ended session: the end of the audio
            if ready is not None:
                self.audio_ready[spec.name] = ready
        while len(marks) > 1:
            marks.popleft()
