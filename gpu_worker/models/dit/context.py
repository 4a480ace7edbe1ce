"""The dit family's context: the chunk's audio (with margins) → audio tokens, and the prompt → text tokens.

The prompt is per session (`RenderOptions.prompt`, carried by every ChunkRequest); an empty one means no
text tokens: the DiT then cross-attends to audio alone, exactly as a checkpoint trained with prompt dropout
expects. The text
encoder is its own model and file, owned by this module; its output is cached per prompt, since every
chunk of a session asks for the same one.

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
from gpu_worker.models.dit.runtime import TorchModule
from gpu_worker.models.dit.text_encoder import TextEncoder, byte_tokens
from gpu_worker.pipeline.module import ContextGenerator
from gpu_worker.pipeline.types import AudioWindow, ChunkRequest


def chunk_prompt(chunk: ChunkRequest) -> str:
    """The session's scene prompt ("" for none)."""
    return chunk.prompt


class DiTContext(TorchModule, ContextGenerator):
    """Context keys: audio (Ta, K, D) tensor; audio_times (Ta,) tensor of frames relative to the chunk's
    first frame; text (Lt, Dt) tensor; text_mask (Lt,) bool tensor. All on this module's device."""

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
        first, end = chunk.first_frame - before, chunk.end_frame + after
        edges = np.array([window.frame_start(frame) for frame in range(first, end + 1)])  # (Ta + 1,)
        mel_frames = len(window.samples) // audio_config.hop + 1
        pooling = frame_pooling(edges, audio_config.hop, mel_frames)  # (Ta, M)
        encoder = self.model("audio_encoder", AudioEncoder)
        with self.running():
            samples = self.tensor(window.samples)[None]  # (1, S)
            audio = encoder(samples, self.tensor(pooling))[0]  # (Ta, K, D)
        text, text_mask = self._encode_prompt(chunk_prompt(chunk))
        return {
            "audio": audio,
            "audio_times": torch.arange(-before, chunk.n_frames + after, device=self.device, dtype=torch.float32),
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
