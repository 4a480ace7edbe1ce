"""The fixed windows on the session's absolute timeline in which speech is recognised as phones, and which
window owns each 10 ms phone step. Standard library only: the live planner (workflow code) derives its
look-ahead from it, and the warp family recognises phones in exactly these windows.

Why fixed windows: a phone recogniser's answer for a moment depends on the audio around it, so running it on
whatever a chunk happens to read would make a frame's mouth depend on the chunk layout, on live arrival or on a
resume. Window k covers steps [k*core - before, (k+1)*core + after) (zeros before the audio starts and after
it ends) and owns the steps [k*core, (k+1)*core): a step's phone is the one its owner recognised, nothing else.
So a frame's phones depend on the samples of the windows that own them and on nothing else; any chunking, a
live session and a resumed one read the same windows and get the same phones.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PhoneWindows:
    rate: int = 16_000
    # 10 ms steps: the recogniser's frame rate (160 samples at 16 kHz).
    step_samples: int = 160
    # Each window owns 1 s. Longer would cost less (less overlap decoded twice) but the live look-ahead grows by
    # the same amount; shorter would cut the look-ahead and cost more (measured in docs/benchmarks.md).
    core_steps: int = 100
    # Context either side of the owned second: the recogniser decides a phone from what comes around it, and
    # phones cut at a window's edge are guessed badly. 0.3 s before (a syllable) and 0.2 s after gave the best
    # agreement with forced alignment for their cost.
    before_steps: int = 30
    after_steps: int = 20
    # The mouth at a frame blends the phones this many steps either side (co-articulation) and reads this many
    # steps ahead (lips move before the sound); the live look-ahead covers both.
    reach_steps: int = 8
    lead_steps: int = 2

    @property
    def window_samples(self) -> int:
        return (self.before_steps + self.core_steps + self.after_steps) * self.step_samples

    def owner(self, step: int) -> int:
        """The window that owns a step (floor division: steps before the audio belong to windows k < 0)."""
        return step // self.core_steps

    def samples(self, window: int) -> tuple[int, int]:
        """The [start, end) samples window `window` is recognised on."""
        start = (window * self.core_steps - self.before_steps) * self.step_samples
        return start, start + self.window_samples

    def frame_step(self, frame: int, fps: int) -> int:
        """The step holding the centre of video frame `frame` (integers: no float rounding moves it)."""
        return (2 * frame + 1) * self.rate // (2 * fps * self.step_samples)

    def steps_for(self, first_frame: int, end_frame: int, fps: int) -> tuple[int, int]:
        """The [first, end) steps the mouth of frames [first_frame, end_frame) reads."""
        first = self.frame_step(first_frame, fps) + self.lead_steps - self.reach_steps
        last = self.frame_step(end_frame - 1, fps) + self.lead_steps + self.reach_steps
        return first, last + 1

    def audio_for(self, first_frame: int, end_frame: int, fps: int) -> tuple[int, int]:
        """The [start, end) samples of every window that owns a step the frames read."""
        first, end = self.steps_for(first_frame, end_frame, fps)
        return self.samples(self.owner(first))[0], self.samples(self.owner(end - 1))[1]

    def frames_ready(self, samples: int, fps: int) -> int:
        """How many frames from the start have every window their mouth reads within the first `samples`
        samples: the largest F with `audio_for(F - 1, F, fps)[1] <= samples` (0 if none)."""
        whole = (samples // self.step_samples - self.core_steps - self.after_steps) // self.core_steps
        last_step = (whole + 1) * self.core_steps - 1 - self.lead_steps - self.reach_steps  # the last one owned
        # frame_step(f) <= last_step  <=>  (2f + 1) * rate < (last_step + 1) * 2 * fps * step_samples
        limit = (last_step + 1) * 2 * fps * self.step_samples
        return max(0, ((limit - 1) // self.rate - 1) // 2 + 1) if limit > 0 else 0

    @property
    def lookahead_samples(self) -> int:
        """The most audio `audio_for` reads past the end of its last frame: the mouth's reach ahead, then the
        rest of a window whose owned second starts there, and its context after (1.3 s; 0.3 s at the least)."""
        return (self.lead_steps + self.reach_steps + self.core_steps + self.after_steps) * self.step_samples


PHONE_WINDOWS = PhoneWindows()
