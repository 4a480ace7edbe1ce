"""The dit family's streaming decoder module: output-resolution latents → RGB frames, one process or split over an
SP group's ranks (roles.py says how anchors carry the decoder's causal state between chunks).

The per-frame (spatial) stage runs through a compiled step (`SpatialStage`, gpu_worker/compiled.py) where
`MONOLOGUE_COMPILE_DECODER` says so (auto: with CUDA): compiled at load for each warm canvas's frame shape
(`MONOLOGUE_DIT_WARM_RESOLUTIONS`), eager at any other shape. The first H200 run measured the stage at 537 ms eager
and 174 ms compiled for a 720p N chunk of 40 frames (docs/benchmarks.md). A compiled frame differs from the eager
one by a few uint8 levels (another order of the same arithmetic) and is the same run after run; it has no
collectives, so it compiles under sequence parallelism too and every rank's frames stay the one-process frames.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from gpu_worker.compiled import CompiledStep, compiled_step, decoder_setting
from gpu_worker.distributed.sequence import current_sp, split_frames, start_gather_frames
from gpu_worker.models.dit.reference import named_canvas
from gpu_worker.models.dit.roles import check_temporal_stride
from gpu_worker.models.dit.runtime import DiTLatents, TorchModule
from gpu_worker.models.dit.vae import SpatialStage, VAEDecoder, fold
from gpu_worker.models.dit.warm import steady_chunks
from gpu_worker.pipeline.module import Decoder, Reference

_SPATIAL_STEP = "_monologue_spatial_step"  # the decoder model's compiled per-frame stage (`DiTDecoder._spatial`)


def spatial_batches(frame_count: int, step: int, degree: int = 1) -> list[list[tuple[int, int]]]:
    """The [start, end) frame batches of the decoder's spatial stage, per rank of an SP group of `degree`.

    The batches are always the one-rank ones, `step` frames each, the last one short; SP hands each rank a
    contiguous run of whole batches (`split_frames` over the batch count), never cutting one. A convolution's
    result can depend on its batch size (it does on CPU for small frames: another algorithm), so frames
    computed in the one-rank batch shapes are the one-rank frames. The split is in units of `step` frames
    (`VAEConfig.frames_per_batch`: 1 in the h200 preset, so SP splits the decode frame by frame); ranks past
    the last batch get none."""
    batches = [(start, min(start + step, frame_count)) for start in range(0, frame_count, step)]
    return [batches[start:end] for start, end in split_frames(len(batches), degree)]


def latents_behind(start: int, end: int, stride: int) -> tuple[int, int]:
    """The [first, last) latents whose temporal stage makes video frames [start, end)."""
    return start // stride, -(-end // stride)


def _rgb(spatial: Callable[[Tensor], Tensor], features: Tensor, crop: tuple[int, int, int, int]) -> Tensor:
    """Features (1, C', n, h, w) → uint8 frames (n, height, width, 3), centre-cropped (top, height, left, width)."""
    top, height, left, width = crop
    pixels = spatial(fold(features))  # (n, 3, H, W)
    pixels = pixels[:, :, top : top + height, left : left + width].float().clamp(-1.0, 1.0)
    return ((pixels + 1.0) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1)


class DiTDecoder(TorchModule, Decoder):
    """Output-resolution latents → RGB frames at the output size (the canvas, centre-cropped)."""

    model_names = ("vae_decoder",)
    # Canvases whose per-frame stage compiles at load (build_family sets them, as the SR module's).
    warm_resolutions: tuple[str, ...] = ()

    def load(self) -> None:
        check_temporal_stride(self.config)
        super().load()
        self._warm_spatial()

    def _spatial(self, model: VAEDecoder) -> CompiledStep:
        """The per-frame stage of the loaded decoder, compiled at the warm canvases' frame shape where it is on. Kept
        on the decoder model (a plain attribute: the step is no module), so the role holds no model it does not
        declare and the step lives and dies with the decoder."""
        step: CompiledStep | None = getattr(model, _SPATIAL_STEP, None)
        if step is None:
            step = compiled_step(SpatialStage(model), self.device, decoder_setting(), collective_free=True)
            setattr(model, _SPATIAL_STEP, step)
        return step

    def _warm_spatial(self) -> None:
        """Compile the per-frame stage at each warm canvas for the batch sizes a default session's chunks decode in
        (`spatial_batches` of its steady chunks: one size, 1 frame, in the h200 preset), made as `decode` makes
        them."""
        model = self.model("vae_decoder", VAEDecoder)
        step = self._spatial(model)
        if not step.active:
            return
        vae = self.config.vae
        frames = (vae.temporal_stride * chunk.latents for chunk in steady_chunks(self.config))
        sizes = sorted(
            {end - start for count in frames for start, end in spatial_batches(count, vae.frames_per_batch)[0]}
        )
        with self.running():
            for resolution in self.warm_resolutions:
                width, height = named_canvas(self.config, resolution)
                for size in sizes:
                    latents = torch.zeros(1, vae.latent_channels, -(-size // vae.temporal_stride), height // vae.stride,
                                          width // vae.stride)  # fmt: skip
                    inputs, _ = model.temporal_inputs(latents.to(self.device), None)
                    step.warm_up(fold(model.frame_features(inputs, range(size))))

    def decode(self, reference: Reference, upscaled: DiTLatents) -> np.ndarray:
        """stride frames per latent, the ones past the chunk's end (`ChunkLatents.video_frames`) dropped.

        Both paths make each batch's features with `VAEDecoder.frame_features` just before its spatial stage, so
        the features of a whole chunk never exist at once. Under sequence parallelism (`current_sp()`) each rank
        runs only its share of the spatial batches (see `spatial_batches`), the latent-rate stage only on the
        latents those frames come from, primed on the `context_frames` latents before them (see
        `_local_inputs`), and depth to time only for its own frames; the ranks all-gather the uint8 frames batch
        by batch (round i, every rank's i-th batch, travels while the ranks decode their next one), so every
        rank returns the one-rank frames."""
        width, height = self.frame_size(reference)
        canvas_width, canvas_height = (int(v) for v in reference["canvas_size"])
        crop = ((canvas_height - height) // 2, height, (canvas_width - width) // 2, width)
        model = self.model("vae_decoder", VAEDecoder)
        spatial = self._spatial(model)
        decoded = self.config.vae.temporal_stride * upscaled.frames.shape[1]
        frame_count = getattr(upscaled, "video_frames", None) or decoded
        if not decoded - self.config.vae.temporal_stride < frame_count <= decoded:
            raise ValueError(f"{upscaled.frames.shape[1]} latents cannot make {frame_count} frames")
        sp = current_sp()
        batches = spatial_batches(frame_count, self.config.vae.frames_per_batch, sp.degree if sp else 1)
        frames = np.empty((frame_count, height, width, 3), dtype=np.uint8)
        with self.running():
            if sp is None:
                state = None if upscaled.context is None else model.prime(upscaled.context[None].to(self.device))
                inputs, _ = model.temporal_inputs(upscaled.frames[None].to(self.device), state)
                for start, end in batches[0]:
                    features = model.frame_features(inputs, range(start, end))
                    frames[start:end] = _rgb(spatial, features, crop).cpu().numpy()
                return frames
            mine = batches[sp.rank]
            if mine:
                inputs, first = self._local_inputs(model, upscaled, mine[0][0], mine[-1][1])
            gathers = []  # round i gathers every rank's i-th batch while the ranks decode their next one
            for index in range(max(len(rank) for rank in batches)):
                local = upscaled.frames.new_empty((0, height, width, 3), dtype=torch.uint8).to(self.device)
                if index < len(mine):
                    start, end = mine[index]
                    local = _rgb(spatial, model.frame_features(inputs, range(start - first, end - first)), crop)
                owners = [rank[index] if index < len(rank) else (0, 0) for rank in batches]
                counts = [end - start for start, end in owners]
                gathers.append((start_gather_frames(local, 0, counts, sp), owners, counts))
            for pending, owners, counts in gathers:
                for (start, end), piece in zip(owners, torch.split(pending.wait(), counts), strict=True):
                    frames[start:end] = piece.cpu().numpy()
        return frames

    def _local_inputs(self, model: VAEDecoder, upscaled: DiTLatents, start: int, end: int) -> tuple[Tensor, int]:
        """(the temporal stage's depth-to-time inputs for the latents behind frames [start, end), the video frame
        of their first latent).

        The latent-rate stage runs on latents [start // stride, ceil(end / stride)) only, from the state primed
        on the up to `context_frames` latents before them in context + latents (`VAEDecoder.prime` is exact with
        that many; with fewer, they reach back to where the one-rank decode starts, the chunk's context or the
        video's first latent, so priming on them is that decode's own start)."""
        stride = self.config.vae.temporal_stride
        first, last = latents_behind(start, end, stride)
        context = upscaled.context
        sequence = upscaled.frames if context is None else torch.cat([context, upscaled.frames], dim=1)
        known = 0 if context is None else context.shape[1]  # sequence index of latent 0 of the chunk
        before = sequence[:, max(0, known + first - self.config.vae.context_frames) : known + first]
        state = model.prime(before[None].to(self.device)) if before.shape[1] else None
        inputs, _ = model.temporal_inputs(upscaled.frames[None, :, first:last].to(self.device), state)
        return inputs, first * stride

    @staticmethod
    def frame_size(reference: Reference) -> tuple[int, int]:
        width, height = (int(v) for v in reference["frame_size"])
        return width, height
