"""InfiniteTalk's streaming clips as Monologue's chunks: audio-to-video, the (absent) super-resolution, the decoder.

The latent grid. The Wan VAE makes the video's first frame one latent and every 4 frames after it one more, so
latent 0 is frame 0 and latent j ≥ 1 frames 4j-3 .. 4j. N0 has 1 + 4k frames; every later chunk starts on 1 + 4m
(`contracts.Family.INFINITETALK.leading_frames`).

N chunks are InfiniteTalk's clips (`wan/multitalk.py` generate_infinitetalk):
- N0 is the first clip: its first latent is the portrait's own latent, kept clean (lines 576-577, 711), so the video
  opens on the portrait.
- N(k) is a later clip: it opens with `motion_frames` (9) frames of N(k-1), the last the viewer saw of it, decoded
  and encoded again as a video of their own (lines 579, 803: 1 + 2 latents), kept clean, then the chunk's own
  latents; only those are its output (line 794). The motion frames bring their audio windows along. The decoder
  stage encodes them from the frames it decodes anyway (the stream's last frames, bit for bit what a decode of the
  tail alone makes: vae.py), completing N(k-1)'s tail anchor.
- Every clip is conditioned on the portrait: its mask marks the first frame and its I2V condition is the VAE
  encoding of the portrait followed by grey frames, for the clip's length (lines 551-581: the same for every clip
  of a length, so encoded once per length, `ConditionCache`); its image context is the portrait's CLIP tokens.
I chunks are ours: the seam between N(k) and N(k+1) is sampled as a clip with N(k)'s motion frames before it and
N(k+1)'s first `right_latents` latents after it, both kept clean, the same in-context replacement InfiniteTalk
uses for motion frames, on both sides. N(k+1) itself was conditioned on N(k)'s end as if the seam were absent
(it is generated before I(k)); the I chunk bridges the two.

Anchors (numpy, into checkpoints as they are). N's head: its first `right_latents` latents and their frames' audio
windows. N's tail: `context`, the last `decoder_context` latents of the decode stream that ends with the chunk
(the chunk's own decoder context, then its latents), with the video latent its first is; `motion_audio`, its last
motion frames' windows; `motion`, their latents, which the decoder stage adds (`WanLatents.tail`). The decoder
primes its causal cache on `context`: I(k) continues N(k)'s stream; N(k+1) continues it too, skipping I(k), which
does not exist yet when N(k+1) is decoded.
With `decoder_context` ≥ the decoder's receptive field (38) the primed cache is exactly the cache of decoding
the stream from the video's start (vae.py), so a chunk decodes the same after a resume on any node.

Under sequence parallelism (`current_sp()`, a multi-GPU node's default) the DiT splits its tokens across the ranks
(dit.py), returning the one-process result on every rank. The decoder does not split where the node keeps decode
states (`StreamConfig.decoder_states` > 0, the default): every rank decodes the whole chunk from its own kept state,
as one process does (18 latent calls for a steady N chunk), since a split rank primes on the 38 latents before its
run (38 + 18 / P calls: more than the whole chunk at any P; measured on one H200, the Wan VAE's 98.5 TFLOP/s made
that priming the 8-GPU node's limit, docs/benchmarks.md). With no states kept, every chunk primes anyway, so the
decoder splits its latents (`vae.decode_share`: each rank its run, primed on the latents before it; the uint8 frames
all-gathered; the motion frames' float frames gathered from the ranks that decoded them and encoded whole on every
rank). Both return the one-process frames on every rank.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gpu_worker.compiled import compiled_step
from gpu_worker.distributed.sequence import SPGroup, current_sp, gather_frames
from gpu_worker.lru import LRU
from gpu_worker.models.infinitetalk.config import SamplingConfig
from gpu_worker.models.infinitetalk.lora import LORA_ENV
from gpu_worker.models.infinitetalk.reference import reference_image
from gpu_worker.models.infinitetalk.runtime import WanModule
from gpu_worker.models.infinitetalk.sampling import sample, timesteps
from gpu_worker.models.infinitetalk.vae import StreamStates, decode_share, encode
from gpu_worker.pipeline.module import A2VOutput, Anchor, AudioToVideo, Decoder, Reference, SuperResolution
from gpu_worker.pipeline.progress import StepProgress, no_steps
from gpu_worker.pipeline.types import ChunkRequest
from monologue.contracts import ChunkKind, SamplingPreset
from monologue.errors import InputError


@dataclass
class WanLatents:
    """A chunk's latents (z, T, h, w), the decoder context before them (z, K, h, w) or None, the frames they make;
    for an N chunk, its tail anchor, which the decoder completes with the latents of its last `motion_frames`."""

    frames: Tensor
    context: Tensor | None
    video_frames: int
    tail: Anchor | None = None
    motion_frames: int = 0


def first_latent(chunk: ChunkRequest, stride: int) -> int:
    """The video latent a chunk's first latent is; a ValueError for a chunk off the grid."""
    if chunk.first_frame == 0:
        return 0
    if (chunk.first_frame - 1) % stride or (chunk.kind == ChunkKind.I and chunk.n_frames % stride):
        raise ValueError(
            f"{chunk.name} (frames {chunk.first_frame}..{chunk.end_frame - 1}) is off the Wan VAE's latent grid: the "
            f"infinitetalk family needs first_chunk_frames of 1 + a multiple of {stride} and chunk_frames and i_frames "
            f"in multiples of {stride}"
        )
    return (chunk.first_frame - 1) // stride + 1


def latent_count(chunk: ChunkRequest, stride: int) -> int:
    if chunk.first_frame == 0:
        return 1 + -(-(chunk.n_frames - 1) // stride)
    return -(-chunk.n_frames // stride)


def _array(tensor: Tensor) -> np.ndarray:
    return np.ascontiguousarray(tensor.float().cpu().numpy())


class ConditionCache:
    """The I2V condition by portrait and clip length. It is the same for every clip of a length, so a session encodes
    it once per length it uses (N0's, the N chunks', the I chunks', a shorter last chunk's); the values depend on the
    portrait and the length alone, so a session resumed elsewhere gets them bit for bit. The least recently used
    entry goes past `size` (a few lengths for each of a node's sessions)."""

    def __init__(self, size: int = 8) -> None:
        self.encodes = 0  # how many times `make` ran
        self._kept: LRU[tuple[str, int], Tensor] = LRU(size)

    def get(self, pixels: np.ndarray, count: int, make: Callable[[], Tensor]) -> Tensor:
        key = (hashlib.sha256(np.ascontiguousarray(pixels).tobytes()).hexdigest(), count)
        value = self._kept.get(key)
        if value is None:
            value = make()
            self._kept.put(key, value)
            self.encodes += 1
        return value


class InfiniteTalkAudioToVideo(WanModule, AudioToVideo):
    """A chunk's latents by InfiniteTalk's sampler; the anchors it leaves (see the module docstring)."""

    model_names = ("dit", "vae")
    quantized_models = ("dit",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conditions = ConditionCache()

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
        stride = self.settings.vae.temporal_stride
        first, count = first_latent(chunk, stride), latent_count(chunk, stride)
        with self.running():
            audio = context["audio"].to(self.device)
            if previous is None:
                if first != 0:
                    raise ValueError(f"{chunk.name} has no previous chunk but does not start the video")
                known, prefix = [(0, self.tensor(reference["latent"]))], 0
                clip_audio = audio
            else:
                motion = self.tensor(previous["motion"])
                known, prefix = [(0, motion)], motion.shape[1]
                clip_audio = torch.cat([self.tensor(previous["motion_audio"]), audio])
            latents = self._sample(reference, context, clip_audio, known, prefix + count, chunk, rng, progress)
            own = latents[:, prefix:]
            decoder_context = None if previous is None else self.tensor(previous["context"])
            tail, motion_frames = self._tail(own, decoder_context, previous, first, audio)
        right = self.settings.stream.right_latents
        head_frames = (1 + stride * (right - 1)) if first == 0 else stride * right
        head = {"latents": _array(own[:, :right]), "audio": _array(audio[:head_frames])}
        made = WanLatents(own, decoder_context, chunk.n_frames, tail=tail, motion_frames=motion_frames)
        return A2VOutput(latents=made, head=head, tail=tail)

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
        stride = self.settings.vae.temporal_stride
        first_latent(chunk, stride)
        count = latent_count(chunk, stride)
        with self.running():
            motion, after = self.tensor(left["motion"]), self.tensor(right["latents"])
            prefix = motion.shape[1]
            audio = torch.cat(
                [self.tensor(left["motion_audio"]), context["audio"].to(self.device), self.tensor(right["audio"])]
            )
            known = [(0, motion), (prefix + count, after)]
            latents = self._sample(
                reference, context, audio, known, prefix + count + after.shape[1], chunk, rng, progress
            )
            own = latents[:, prefix : prefix + count]
        return A2VOutput(latents=WanLatents(own, self.tensor(left["context"]), chunk.n_frames))

    def _sample(
        self,
        reference: Reference,
        context: dict[str, Any],
        audio: Tensor,
        known: list[tuple[int, Tensor]],
        count: int,
        chunk: ChunkRequest,
        rng: np.random.Generator,
        progress: StepProgress,
    ) -> Tensor:
        """`count` latents of one clip: noise from the chunk's generator, the portrait's I2V condition for that
        length, the prompts, the portrait's CLIP tokens and the clip's audio windows."""
        latent, sampling = reference["latent"], self._sampling(chunk)
        noise = self.tensor(rng.standard_normal((latent.shape[0], count, *latent.shape[2:]), dtype=np.float32))
        steps = chunk.sampling_steps or sampling.steps
        if int(reference["preview"][0]):
            steps = max(1, steps // 2)
        shift = sampling.shift_720 if int(reference["large"][0]) else sampling.shift_480
        conditions = (context["text"], context["negative"], self.tensor(reference["clip"]), audio)
        conditions = tuple(c.to(self.device, torch.float32) for c in conditions)  # type: ignore[assignment]
        # Compiled at the buckets warmed on it (gpu_worker/compiled.py: none at load yet), eager at any other.
        step = compiled_step(self.models["dit"], self.device)
        return sample(
            step,  # type: ignore[arg-type]
            sampling,
            noise,
            self._condition(reference, count),
            conditions,  # type: ignore[arg-type]
            known,
            timesteps(steps, shift, sampling.num_timesteps, sampling.spacing),
            progress,
        )

    def _sampling(self, chunk: ChunkRequest) -> SamplingConfig:
        """The session's preset; `fast` only where the DiT has a distilled LoRA merged (its schedule and guidance
        off are what the LoRA was distilled to: on the plain weights they make blurred frames)."""
        if chunk.sampling_preset is SamplingPreset.FAST and self.family_weights.lora is None:
            raise InputError(
                f"sampling_preset={chunk.sampling_preset} needs a distilled LoRA, and this node has none: its operator "
                f"sets {LORA_ENV} (e.g. lightx2v's 4-step LoRA for Wan2.1-I2V-14B); or use sampling_preset="
                f"{SamplingPreset.QUALITY}"
            )
        return self.settings.sampler(chunk.sampling_preset)

    def _condition(self, reference: Reference, count: int) -> Tensor:
        """(4 + z, count, h, w): the mask (the first frame known, multitalk.py lines 552-559) and the encoding of the
        portrait followed by grey frames, 1 + 4 (count - 1) frames (lines 570-573), encoded once per length."""

        def encoded_video() -> Tensor:
            image = reference_image(reference, self.device)  # (1, 3, H, W)
            frames = 1 + self.settings.vae.temporal_stride * (count - 1)
            video = torch.zeros(1, 3, frames, *image.shape[-2:], device=self.device)
            video[:, :, 0] = image
            return encode(self.models["vae"], video)[0]  # type: ignore[arg-type]  # (z, count, h, w)

        encoded = self.conditions.get(reference["pixels"], count, encoded_video)
        mask = torch.zeros(4, count, *encoded.shape[-2:], device=self.device)
        mask[:, 0] = 1.0
        return torch.cat([mask, encoded])

    def _tail(
        self, own: Tensor, context: Tensor | None, previous: Anchor | None, first: int, audio: Tensor
    ) -> tuple[Anchor, int]:
        """The tail anchor but its `motion` (the decoder adds it): the stream's last latents and the motion frames'
        audio windows; and how many motion frames (the chunk's last, on the latent grid)."""
        stream_config, stride = self.settings.stream, self.settings.vae.temporal_stride
        stream = own if context is None else torch.cat([context, own], dim=1)
        stream_first = first if previous is None else int(previous["context_first"][0])
        frames = audio.shape[0]
        motion_frames = 1 + stride * ((min(stream_config.motion_frames, frames) - 1) // stride)
        keep = min(stream_config.decoder_context, stream.shape[1])
        tail = {
            "context": _array(stream[:, -keep:]),
            "context_first": np.array([stream_first + stream.shape[1] - keep], dtype=np.int64),
            "motion_audio": _array(audio[frames - motion_frames :]),
        }
        return tail, motion_frames


class PassThrough(SuperResolution):
    """InfiniteTalk generates at the output size: nothing to upscale."""

    def upscale(self, reference: Reference, latents: Any) -> Any:
        return latents


class InfiniteTalkDecoder(WanModule, Decoder):
    """The chunk's latents → RGB frames, the causal cache primed on the decoder context or, on one process, taken from
    the state the previous N chunk's decode left (`StreamStates`; see the module docstring); an N chunk's motion
    frames encoded into its tail anchor."""

    model_names = ("vae",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.states = StreamStates(self.settings.stream.decoder_states)

    def decode(self, reference: Reference, upscaled: WanLatents) -> np.ndarray:
        """One stream, from a kept state where there is one; under SP with no states kept, each rank decodes its run
        of the latents (`decode_share`) and the ranks all-gather the uint8 frames (see the module docstring): every
        rank returns the one-process frames."""
        sp = None if self.states.capacity else current_sp()  # kept states: every rank decodes the whole chunk
        with self.running():
            vae = self.models["vae"]
            context = None if upscaled.context is None else upscaled.context[None].to(self.device)
            latents = upscaled.frames[None].to(self.device)
            if sp is None:
                stream = self.states.start(vae, context)  # type: ignore[arg-type]
                frames = stream.decode(latents)[0]  # (3, F, H, W)
                counts: Sequence[int] = [frames.shape[1]]
                if upscaled.tail is not None:  # an N chunk: later chunks continue its stream from its tail context
                    self.states.keep(stream, upscaled.tail["context"])
            else:
                stride, primed = self.settings.vae.temporal_stride, self.settings.stream.decoder_context
                frames, counts = decode_share(vae, context, latents, stride, primed, sp)  # type: ignore[arg-type]
                frames = frames[0]  # (3, F_rank, H, W)
            if upscaled.tail is not None:
                self._add_motion(upscaled.tail, frames, counts, upscaled.motion_frames, sp)
            pixels = _pixels(frames)  # (F or F_rank, H, W, 3)
            if sp is not None:
                pixels = gather_frames(pixels, 0, counts, sp)
            pixels = pixels[: upscaled.video_frames]
        if pixels.shape[0] != upscaled.video_frames:
            raise ValueError(
                f"{upscaled.frames.shape[1]} latents made {pixels.shape[0]} frames, not {upscaled.video_frames}"
            )
        return np.ascontiguousarray(pixels.cpu().numpy())

    def _add_motion(
        self, tail: Anchor, frames: Tensor, counts: Sequence[int], motion_frames: int, sp: SPGroup | None
    ) -> None:
        """The tail's `motion`: the chunk's last `motion_frames` decoded frames (float, as the original takes them
        from its decoded clip), encoded again. Under SP each rank holds `counts[r]` of the chunk's frames, in rank
        order: the ranks holding the last ones send them to every rank, and each encodes them whole."""
        if sp is None:
            last = frames[:, -motion_frames:]
        else:
            start, held = sum(counts) - motion_frames, 0
            overlaps = []
            for count in counts:  # how many of the last frames each rank holds
                overlaps.append(max(0, held + count - max(start, held)))
                held += count
            local = frames[:, frames.shape[1] - overlaps[sp.rank] :]
            last = gather_frames(local.contiguous(), 1, overlaps, sp)
        tail["motion"] = _array(encode(self.models["vae"], last[None])[0])  # type: ignore[arg-type]


def _pixels(frames: Tensor) -> Tensor:
    """(3, F, H, W) in [-1, 1] → uint8 (F, H, W, 3)."""
    return ((frames + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 3, 0)
