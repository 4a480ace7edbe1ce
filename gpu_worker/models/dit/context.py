"""The dit family's context: the chunk's audio (with margins) → audio tokens, and the prompt → text tokens.

The prompt is per session (`RenderOptions.prompt`, carried by every ChunkRequest); an empty one means no
text tokens: the DiT then cross-attends to audio alone, exactly as a checkpoint trained with prompt dropout
expects. The text
encoder is its own model and file, owned by this module; its output is cached per prompt, since every
chunk of a session asks for the same one.

Audio tokens are per video frame, over the chunk's latent span: ceil(T / 4) latents cover 4 frames each,
so a session's ragged last chunk gets tokens for the frames its last latent covers past the chunk's end
(silence: the audio has ended there) and the A2V DiT maps each latent to the tokens of its own frames.

The chunk's noise is drawn by the audio-to-video module (it alone knows the latent size), from the
chunk's own generator, so this module leaves the generator untouched.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from gpu_worker.models.dit.audio_encoder import AudioEncoder, frame_pooling
from gpu_worker.models.dit.checkpoint import Weights
from gpu_worker.models.dit.roles import chunk_latents
from gpu_worker.models.dit.runtime import TorchModule
from gpu_worker.models.dit.text_encoder import TextEncoder, byte_tokens
from gpu_worker.pipeline.module import ContextGenerator
from gpu_worker.pipeline.types import AudioWindow, ChunkRequest


def chunk_prompt(chunk: ChunkRequest) -> str:
    """The session's scene prompt ("" for none)."""
    return chunk.prompt


class DiTContext(TorchModule, ContextGenerator):
    """Context keys: audio (Ta, K, D) tensor; audio_times (Ta,) tensor of video frames relative to the chunk's
    first frame (margins included, and the frames a ragged last latent covers); text (Lt, Dt) tensor;
    text_mask (Lt,) bool tensor. All on this module's device."""

    model_names = ("audio_encoder", "text_encoder")

    def __init__(self, weights: Weights) -> None:
        super().__init__(weights)
        self.margin_frames = weights.config.audio.margin_frames
        self._prompt: tuple[tuple[str, str], Tensor, Tensor] | None = None  # ((prompt, device), text, mask)

    def context(self, window: AudioWindow, chunk: ChunkRequest, rng: np.random.Generator) -> dict[str, Any]:
        audio_config = self.config.audio
        if window.rate != audio_config.sample_rate:
            raise ValueError(f"the dit audio encoder takes {audio_config.sample_rate} Hz audio, got {window.rate} Hz")
        before, after = self.margin_frames
        span = self.config.vae.temporal_stride * chunk_latents(chunk, self.config.vae.temporal_stride)
        first, end = chunk.first_frame - before, chunk.first_frame + span + after
        edges = np.array([window.frame_start(frame) for frame in range(first, end + 1)])  # (Ta + 1,)
        # The window ends `after` frames past the chunk; a ragged last chunk's span reaches past that: silence.
        samples = np.pad(window.samples, (0, max(0, int(edges[-1]) - len(window.samples))))
        mel_frames = len(samples) // audio_config.hop + 1
        pooling = frame_pooling(edges, audio_config.hop, mel_frames)  # (Ta, M)
        encoder = self.model("audio_encoder", AudioEncoder)
        with self.running():
            audio = encoder(self.tensor(samples)[None], self.tensor(pooling))[0]  # (Ta, K, D)
        text, text_mask = self._encode_prompt(chunk_prompt(chunk))
        return {
            "audio": audio,
            "audio_times": torch.arange(-before, span + after, device=self.device, dtype=torch.float32),
            "text": text,
            "text_mask": text_mask,
        }

    def _encode_prompt(self, prompt: str) -> tuple[Tensor, Tensor]:
        if self._prompt is not None and self._prompt[0] == (prompt, self.device):
            return self._prompt[1], self._prompt[2]
        tokens = byte_tokens(prompt, self.config.text.max_bytes)
        if tokens.size == 0:
            text = torch.zeros(0, self.config.text.dim, device=self.device)
            mask = torch.zeros(0, dtype=torch.bool, device=self.device)
        else:
            encoder = self.model("text_encoder", TextEncoder)
            with self.running():
                embeddings, masks = encoder(torch.from_numpy(tokens).to(self.device)[None])
            text, mask = embeddings[0], masks[0]
        self._prompt = ((prompt, self.device), text, mask)
        return text, mask
