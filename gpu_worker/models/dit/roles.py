"""The dit family's generation modules: audio-to-video, super-resolution and the streaming decoder.

Anchors. An N chunk leaves two, as numpy arrays (they go into checkpoints as they are):
- head: its first `boundary_frames` low-resolution latents (the right anchor of the I chunk before it);
- tail: its last max(`boundary_frames`, decoder context) latents (the left anchor of the I chunk after
  it, the boundary the next N chunk continues from, and the decoder's causal context).
Each is {"latents": (C, K, h, w) float32, "first_frame": (1,) int64, the absolute frame of latents[:, 0]}.

The decoder's causal state. Chunks are generated N0 N1 I0 N2 I1 … but shown N0 I0 N1 I1 …, and each is
decoded as soon as it is generated, so a chunk's decoder can only be primed from frames that exist:
- I(k) follows N(k) in the timeline, and N(k) exists: its decoder is primed on N(k)'s last latents, the
  frames shown just before it.
- N(k) follows I(k-1), which does not exist yet: its decoder is primed on N(k-1)'s last latents instead,
  the nearest frames that do exist (i_frames earlier, the same ones its motion continues from). Its first
  `context_frames` frames decode as if I(k-1) were absent; the alternative, a fresh state, would restart
  the decoder's temporal filtering at every N chunk as if the video began there.
- N0 starts the video (its first frame replicated into the past, as a whole decode does).
The context latents go through the super-resolution DiT with the chunk (they are its temporal neighbours
there too), prime the decoder, and their own frames are dropped. Given the same output-resolution
latents, chunked decoding is exactly whole decoding (test_vae.py); across the pipeline the seams are
continuous but not bit-equal with a whole-timeline decode, because the context is upscaled again next to
the new chunk. The state is re-computed from the anchors (latents are kilobytes; the state itself is tens
of MB of activations at 720p), so a chunk regenerated on another node after a resume is bit-identical.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from gpu_worker.models.dit.a2v import A2VConditioning, AudioToVideoDiT, guided_velocity
from gpu_worker.models.dit.flow import euler_sample, sampling_timesteps
from gpu_worker.models.dit.runtime import DiTLatents, TorchModule
from gpu_worker.models.dit.sr import SuperResolutionDiT
from gpu_worker.models.dit.vae import VAEDecoder, fold
from gpu_worker.pipeline.module import A2VOutput, Anchor, AudioToVideo, Decoder, Reference, SuperResolution
from gpu_worker.pipeline.progress import StepProgress, no_steps
from gpu_worker.pipeline.types import ChunkRequest


def _anchor(latents: Tensor, first_frame: int) -> Anchor:
    return {
        "latents": np.ascontiguousarray(latents.float().cpu().numpy()),
        "first_frame": np.array([first_frame], dtype=np.int64),
    }


def _last(latents: np.ndarray, count: int) -> np.ndarray:
    """The last `count` frames of (C, K, h, w) latents (none for 0, unlike latents[:, -0:])."""
    return latents[:, latents.shape[1] - min(count, latents.shape[1]) :]


def _anchor_frames(anchor: Anchor) -> tuple[np.ndarray, int]:
    """(latents (C, K, h, w), first frame) of an anchor, or a ValueError naming what is missing."""
    if "latents" not in anchor or "first_frame" not in anchor:
        raise ValueError(f"not a dit anchor (keys {sorted(anchor)}); was it written by another family?")
    return anchor["latents"], int(anchor["first_frame"][0])


class DiTAudioToVideo(TorchModule, AudioToVideo):
    """Low-resolution latents for a chunk, by Euler sampling of the flow-matching DiT."""

    model_names = ("a2v",)

    def generate_n(
        self,
        reference: Reference,
        context: dict[str, Any],
        previous: Anchor | None,
        chunk: ChunkRequest,
        rng: np.random.Generator,
        *,
        progress: StepProgress = no_steps,
    ) -> A2VOutput:
        """An N chunk continuing from the previous N chunk's tail (None for the first chunk)."""
        boundary_frames = self.config.a2v.boundary_frames
        channels, height, width = reference["reference_latents_low"].shape
        boundary = np.zeros((channels, 0, height, width), dtype=np.float32)
        times = np.zeros(0, dtype=np.float32)
        decoder_context: Tensor | None = None
        if previous is not None:
            latents, first = _anchor_frames(previous)
            end = first + latents.shape[1]
            if end > chunk.first_frame:
                raise ValueError(f"{chunk.name} starts at frame {chunk.first_frame}, before its anchor ends ({end})")
            boundary = _last(latents, boundary_frames)
            times = np.arange(end - boundary.shape[1], end, dtype=np.float32) - chunk.first_frame
            decoder_context = self._decoder_context(latents)
        frames = self._sample(reference, context, boundary, times, chunk, rng, progress)  # (C, T, h, w)
        keep = min(max(boundary_frames, self.config.vae.context_frames, 1), chunk.n_frames)
        return A2VOutput(
            latents=DiTLatents(frames, decoder_context),
            head=_anchor(frames[:, :boundary_frames], chunk.first_frame),
            tail=_anchor(frames[:, chunk.n_frames - keep :], chunk.end_frame - keep),
        )

    def generate_i(
        self,
        reference: Reference,
        context: dict[str, Any],
        left: Anchor,
        right: Anchor,
        chunk: ChunkRequest,
        rng: np.random.Generator,
        *,
        progress: StepProgress = no_steps,
    ) -> A2VOutput:
        """The frames between N(k)'s tail and N(k+1)'s head, conditioned on both."""
        boundary_frames = self.config.a2v.boundary_frames
        left_latents, left_first = _anchor_frames(left)
        right_latents, right_first = _anchor_frames(right)
        left_end = left_first + left_latents.shape[1]
        if not (left_end <= chunk.first_frame and chunk.end_frame <= right_first):
            raise ValueError(
                f"{chunk.name} (frames {chunk.first_frame}..{chunk.end_frame - 1}) is not between its anchors "
                f"(left ends at {left_end}, right starts at {right_first})"
            )
        before, after = _last(left_latents, boundary_frames), right_latents[:, :boundary_frames]
        boundary = np.concatenate([before, after], axis=1)
        times = np.concatenate(
            [np.arange(left_end - before.shape[1], left_end), np.arange(right_first, right_first + after.shape[1])]
        ).astype(np.float32) - float(chunk.first_frame)
        frames = self._sample(reference, context, boundary, times, chunk, rng, progress)
        return A2VOutput(latents=DiTLatents(frames, self._decoder_context(left_latents)))

    def _decoder_context(self, latents: np.ndarray) -> Tensor | None:
        """The latents that re-create the decoder's causal state before the chunk (see the module docstring)."""
        context = _last(latents, self.config.vae.context_frames)
        return self.tensor(context) if context.shape[1] else None

    def _sample(
        self,
        reference: Reference,
        context: dict[str, Any],
        boundary: np.ndarray,
        times: np.ndarray,
        chunk: ChunkRequest,
        rng: np.random.Generator,
        progress: StepProgress,
    ) -> Tensor:
        """Latents (C, T, h, w) from the chunk's noise. The noise is drawn here, from the chunk's generator
        in one fixed call, so the same (seed, chunk) gives the same latents on any node. Each denoising step
        is reported to `progress`: sampling is the longest part of a chunk."""
        a2v = self.config.a2v
        reference_low = reference["reference_latents_low"]  # (C, h, w)
        noise = rng.standard_normal((1, reference_low.shape[0], chunk.n_frames, *reference_low.shape[1:]), np.float32)
        # Preview trades quality for speed: half the steps, the same noise, hence the same motion.
        steps = max(1, a2v.sampling_steps // 2) if int(reference["preview"][0]) else a2v.sampling_steps
        model = self.model("a2v", AudioToVideoDiT)
        with self.running():
            cond = A2VConditioning(
                reference=self.tensor(reference_low)[None],
                boundary=self.tensor(boundary)[None],
                boundary_times=self.tensor(times),
                audio=self.tensor(context["audio"])[None],
                audio_times=self.tensor(context["audio_times"]),
                text=self.tensor(context["text"])[None],
                text_mask=context["text_mask"].to(self.device)[None],
                keep_audio=torch.ones(1, dtype=torch.bool, device=self.device),
            )
            velocity = guided_velocity(model, cond, a2v.guidance_scale)
            timesteps = sampling_timesteps(steps, a2v.timestep_shift)
            latents = euler_sample(velocity, self.tensor(noise), timesteps, on_step=progress)
        return latents[0].float()


class DiTSuperResolution(TorchModule, SuperResolution):
    """Low-resolution latents → output-resolution latents, the decoder context frames included."""

    model_names = ("sr",)

    def upscale(self, reference: Reference, latents: DiTLatents) -> DiTLatents:
        context = latents.context
        sequence = (
            latents.frames if context is None else torch.cat([context, latents.frames], dim=1)
        )  # (C, K + T, h, w)
        model = self.model("sr", SuperResolutionDiT)
        with self.running():
            upscaled = model(sequence[None].to(self.device), self.tensor(reference["reference_latents"])[None])[0]
        upscaled = upscaled.float()
        if context is None:
            return DiTLatents(upscaled)
        return DiTLatents(upscaled[:, context.shape[1] :], upscaled[:, : context.shape[1]])


class DiTDecoder(TorchModule, Decoder):
    """Output-resolution latents → RGB frames at the output size (the canvas, centre-cropped)."""

    model_names = ("vae_decoder",)

    def decode(self, reference: Reference, upscaled: DiTLatents) -> np.ndarray:
        width, height = self.frame_size(reference)
        canvas_width, canvas_height = (int(v) for v in reference["canvas_size"])
        left, top = (canvas_width - width) // 2, (canvas_height - height) // 2
        model = self.model("vae_decoder", VAEDecoder)
        frame_count = upscaled.frames.shape[1]
        frames = np.empty((frame_count, height, width, 3), dtype=np.uint8)
        with self.running():
            state = None if upscaled.context is None else model.prime(upscaled.context[None].to(self.device))
            features, _ = model.temporal(upscaled.frames[None].to(self.device), state)  # (1, C', T, h, w)
            step = self.config.vae.frames_per_batch
            for start in range(0, frame_count, step):
                pixels = model.spatial(fold(features[:, :, start : start + step]))  # (n, 3, H, W)
                pixels = pixels[:, :, top : top + height, left : left + width].float().clamp(-1.0, 1.0)
                rgb = ((pixels + 1.0) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1)  # (n, height, width, 3)
                frames[start : start + step] = rgb.cpu().numpy()
        return frames

    @staticmethod
    def frame_size(reference: Reference) -> tuple[int, int]:
        width, height = (int(v) for v in reference["frame_size"])
        return width, height
