"""The dit family's generation modules: audio-to-video and super-resolution (decoder.py: the streaming decoder).

The latent grid. The VAE makes one latent frame of every `VAEConfig.temporal_stride` (4) video frames:
latent j covers frames [4 j, 4 j + 4). A chunk of T frames starting at frame f (a multiple of 4) has
ceil(T / 4) latents, the first being latent f / 4; the A2V DiT samples latents, the SR DiT upscales them,
and the decoder makes 4 frames of each and drops those past the chunk's end. So every chunk starts on the
grid and every chunk but the session's last ends on it (the planner sizes chunks so: chunk_frames,
i_frames and first_chunk_frames in multiples of 4); `chunk_latents` refuses anything else. An N chunk
cannot know it is the last, so a ragged N chunk is taken as the last one: whatever follows it starts off
the grid and is refused.

Anchors. An N chunk leaves two, as numpy arrays (they go into checkpoints as they are):
- head: its first `boundary_frames` low-resolution latents (the right anchor of the I chunk before it);
- tail: its last max(`boundary_frames`, decoder context) latents (the left anchor of the I chunk after
  it, the boundary the next N chunk continues from, and the decoder's causal context).
Each is {"latents": (C, K, h, w) float32, "first_frame": (1,) int64}: first_frame is the *video* frame
where latents[:, 0] starts (a multiple of the stride; its latent index is first_frame / stride), so
anchors read the same as the plan's frames. Boundary and context sizes are counted in latents.

The decoder's causal state. Chunks are generated N0 N1 I0 N2 I1 … but shown N0 I0 N1 I1 …, and each is
decoded as soon as it is generated, so a chunk's decoder can only be primed from latents that exist:
- I(k) follows N(k) in the timeline, and N(k) exists: its decoder is primed on N(k)'s last latents, the
  frames shown just before it.
- N(k) follows I(k-1), which does not exist yet: its decoder is primed on N(k-1)'s last latents instead,
  the nearest ones that do exist (i_frames earlier, the same ones its motion continues from). Its first
  `context_frames` latents decode as if I(k-1) were absent; the alternative, a fresh state, would restart
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

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gpu_worker.compiled import compiled_step
from gpu_worker.models.dit.a2v import A2VConditioning, AudioToVideoDiT, guided_velocity
from gpu_worker.models.dit.config import DiTConfig
from gpu_worker.models.dit.flow import euler_sample, sampling_timesteps
from gpu_worker.models.dit.reference import named_canvas
from gpu_worker.models.dit.runtime import DiTLatents, TorchModule
from gpu_worker.models.dit.sr import SuperResolutionDiT
from gpu_worker.models.dit.warm import a2v_inputs, sr_inputs, steady_chunks
from gpu_worker.pipeline.module import A2VOutput, Anchor, AudioToVideo, Reference, SuperResolution
from gpu_worker.pipeline.progress import StepProgress, no_steps
from gpu_worker.pipeline.types import ChunkRequest
from monologue.contracts import ChunkKind, Family as FamilyName


@dataclass
class ChunkLatents(DiTLatents):
    """DiTLatents that know how many video frames they stand for: the decoder makes `temporal_stride` frames
    per latent and keeps the first `video_frames` (fewer than stride x T only for a session's ragged last
    chunk). None keeps them all."""

    video_frames: int | None = None


def check_temporal_stride(config: DiTConfig) -> None:
    """The checkpoint's VAE must compress time as the planner assumes, or chunks would fall off its grid."""
    expected = int(getattr(FamilyName.DIT, "temporal_stride", 4))
    if config.vae.temporal_stride != expected:
        raise ValueError(
            f"this dit checkpoint's VAE makes one latent of every {config.vae.temporal_stride} frames, but the "
            f"planner puts dit chunk boundaries on multiples of {expected}"
        )


def chunk_latents(chunk: ChunkRequest, stride: int) -> int:
    """The latent frames of a chunk, ceil(T / stride); a ValueError for a chunk off the latent grid."""
    ragged = chunk.n_frames % stride != 0
    if chunk.first_frame % stride or (ragged and chunk.kind is ChunkKind.I):
        raise ValueError(
            f"{chunk.name} (frames {chunk.first_frame}..{chunk.end_frame - 1}) is off the dit family's latent grid: "
            f"its VAE makes one latent of every {stride} frames, so the dit family needs chunk_frames, i_frames "
            f"and first_chunk_frames in multiples of {stride} (only a session's last chunk may end off it)"
        )
    return -(-chunk.n_frames // stride)


def _anchor(latents: Tensor, first_frame: int) -> Anchor:
    return {
        "latents": np.ascontiguousarray(latents.float().cpu().numpy()),
        "first_frame": np.array([first_frame], dtype=np.int64),
    }


def _last(latents: np.ndarray, count: int) -> np.ndarray:
    """The last `count` frames of (C, K, h, w) latents (none for 0, unlike latents[:, -0:])."""
    return latents[:, latents.shape[1] - min(count, latents.shape[1]) :]


def _anchor_latents(anchor: Anchor, stride: int) -> tuple[np.ndarray, int]:
    """(latents (C, K, h, w), latent index of latents[:, 0]) of an anchor, or a ValueError naming what is wrong."""
    if "latents" not in anchor or "first_frame" not in anchor:
        raise ValueError(f"not a dit anchor (keys {sorted(anchor)}); was it written by another family?")
    first_frame = int(anchor["first_frame"][0])
    if first_frame % stride:
        raise ValueError(f"a dit anchor starts at frame {first_frame}, off the latent grid of {stride} frames")
    return anchor["latents"], first_frame // stride


class DiTAudioToVideo(TorchModule, AudioToVideo):
    """Low-resolution latents for a chunk, by Euler sampling of the flow-matching DiT."""

    model_names = ("a2v",)
    quantized_models = ("a2v",)
    # Canvases whose steady-state chunks' steps compile at load (build_family sets them, as the SR module's).
    warm_resolutions: tuple[str, ...] = ()

    def load(self) -> None:
        check_temporal_stride(self.config)
        super().load()
        self._warm_steps()

    def _warm_steps(self) -> None:
        """Compile the denoising step for the warm canvases' steady-state chunks (gpu_worker/compiled.py; nothing
        where steps are not compiled): one guided step each, as `_sample` runs it."""
        step = compiled_step(self.model("a2v", AudioToVideoDiT), self.device)
        if not step.active:  # off, or loading under SP, whose steps run eagerly: nothing to warm
            return
        with self.running():
            for resolution in self.warm_resolutions:
                for chunk in steady_chunks(self.config):
                    noise, cond = a2v_inputs(self.config, resolution, chunk, self.device)
                    velocity = guided_velocity(step.warm_up, cond, self.config.a2v.guidance_scale)
                    velocity(noise, torch.ones(1, device=self.device))

    @property
    def stride(self) -> int:
        return self.config.vae.temporal_stride

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
        boundary_frames, stride = self.config.a2v.boundary_frames, self.stride
        count, first = chunk_latents(chunk, stride), chunk.first_frame // stride
        channels, height, width = reference["reference_latents_low"].shape
        boundary = np.zeros((channels, 0, height, width), dtype=np.float32)
        times = np.zeros(0, dtype=np.float32)
        decoder_context: Tensor | None = None
        if previous is not None:
            latents, previous_first = _anchor_latents(previous, stride)
            end = previous_first + latents.shape[1]  # latent index past the anchor
            if end > first:
                raise ValueError(
                    f"{chunk.name} starts at frame {chunk.first_frame}, before its anchor ends (frame {end * stride})"
                )
            boundary = _last(latents, boundary_frames)
            times = np.arange(end - boundary.shape[1], end, dtype=np.float32) - first
            decoder_context = self._decoder_context(latents)
        frames = self._sample(reference, context, boundary, times, count, rng, progress)  # (C, T', h, w)
        keep = min(max(boundary_frames, self.config.vae.context_frames, 1), count)
        return A2VOutput(
            latents=ChunkLatents(frames, decoder_context, video_frames=chunk.n_frames),
            head=_anchor(frames[:, :boundary_frames], chunk.first_frame),
            tail=_anchor(frames[:, count - keep :], (first + count - keep) * stride),
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
        boundary_frames, stride = self.config.a2v.boundary_frames, self.stride
        count, first = chunk_latents(chunk, stride), chunk.first_frame // stride
        left_latents, left_first = _anchor_latents(left, stride)
        right_latents, right_first = _anchor_latents(right, stride)
        left_end = left_first + left_latents.shape[1]
        if not (left_end <= first and first + count <= right_first):
            raise ValueError(
                f"{chunk.name} (frames {chunk.first_frame}..{chunk.end_frame - 1}) is not between its anchors "
                f"(left ends at frame {left_end * stride}, right starts at frame {right_first * stride})"
            )
        before, after = _last(left_latents, boundary_frames), right_latents[:, :boundary_frames]
        boundary = np.concatenate([before, after], axis=1)
        times = np.concatenate(
            [np.arange(left_end - before.shape[1], left_end), np.arange(right_first, right_first + after.shape[1])]
        ).astype(np.float32) - float(first)
        frames = self._sample(reference, context, boundary, times, count, rng, progress)
        context_latents = self._decoder_context(left_latents)
        return A2VOutput(latents=ChunkLatents(frames, context_latents, video_frames=chunk.n_frames))

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
        count: int,
        rng: np.random.Generator,
        progress: StepProgress,
    ) -> Tensor:
        """`count` latents (C, count, h, w) from the chunk's noise; `times` are the boundary latents' indices
        relative to the chunk's first latent. The noise is drawn here, from the chunk's generator
        in one fixed call, so the same (seed, chunk) gives the same latents on any node. Each denoising step
        is reported to `progress`: sampling is the longest part of a chunk."""
        a2v = self.config.a2v
        reference_low = reference["reference_latents_low"]  # (C, h, w)
        noise = rng.standard_normal((1, reference_low.shape[0], count, *reference_low.shape[1:]), np.float32)
        # Preview trades quality for speed: half the steps, the same noise, hence the same motion.
        steps = max(1, a2v.sampling_steps // 2) if int(reference["preview"][0]) else a2v.sampling_steps
        step = compiled_step(self.model("a2v", AudioToVideoDiT), self.device)  # compiled at warm buckets
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
            velocity = guided_velocity(step, cond, a2v.guidance_scale)
            timesteps = sampling_timesteps(steps, a2v.timestep_shift)
            latents = euler_sample(velocity, self.tensor(noise), timesteps, on_step=progress)
        return latents[0].float()


class DiTSuperResolution(TorchModule, SuperResolution):
    """Low-resolution latents → output-resolution latents, the decoder context frames included."""

    model_names = ("sr",)
    quantized_models = ("sr",)
    # Canvases whose attention buckets compile at load (build_family sets them from MONOLOGUE_DIT_WARM_RESOLUTIONS);
    # another canvas (a `source`-sized portrait) compiles its buckets once, before its first chunk's forward.
    warm_resolutions: tuple[str, ...] = ()

    def load(self) -> None:
        super().load()
        self._warmed: set[tuple[int, int]] = set()
        for resolution in self.warm_resolutions:
            width, height = named_canvas(self.config, resolution)
            self._warm(height // self.config.vae.stride, width // self.config.vae.stride)
        self._warm_steps()

    def _warm_steps(self) -> None:
        """Compile the SR pass for the warm canvases' steady-state chunks (gpu_worker/compiled.py; nothing where
        steps are not compiled), after the attention's own buckets."""
        step = compiled_step(self.model("sr", SuperResolutionDiT), self.device)
        if not step.active:  # off, or loading under SP, whose steps run eagerly: nothing to warm
            return
        with self.running():
            for resolution in self.warm_resolutions:
                for chunk in steady_chunks(self.config):
                    step.warm_up(*sr_inputs(self.config, resolution, chunk, self.device))

    def _warm(self, height: int, width: int) -> None:
        """Compile the SR attention's buckets for output latents (height, width), once per process."""
        if (height, width) not in self._warmed:
            self.model("sr", SuperResolutionDiT).warm_up(height, width)
            self._warmed.add((height, width))

    def upscale(self, reference: Reference, latents: DiTLatents) -> DiTLatents:
        self._warm(*reference["reference_latents"].shape[-2:])
        context = latents.context
        sequence = (
            latents.frames if context is None else torch.cat([context, latents.frames], dim=1)
        )  # (C, K + T, h, w)
        step = compiled_step(self.model("sr", SuperResolutionDiT), self.device)  # compiled at warm buckets
        with self.running():
            upscaled = step(sequence[None].to(self.device), self.tensor(reference["reference_latents"])[None])[0]
        upscaled = upscaled.float()
        video_frames = getattr(latents, "video_frames", None)
        if context is None:
            return ChunkLatents(upscaled, video_frames=video_frames)
        return ChunkLatents(upscaled[:, context.shape[1] :], upscaled[:, : context.shape[1]], video_frames)
