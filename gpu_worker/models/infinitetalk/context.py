"""The context: the chunk's speech → wav2vec2 windows per frame, the prompt and the negative prompt → umT5 tokens.

Audio (see encoders.py): wav2vec2 runs over the chunk's frames plus `audio_context_frames` before and the 2 its
last window reads ahead (`margin_frames`; a live session stores 0.1 s past a chunk, so reading further ahead would
stall it). Frame f's window is the features of frames f-2..f+2, clamped at the video's first frame as the original
clamps at its first. The frames are the chunk's own latent span (a session's ragged last chunk: its last latent's
frames past the end hear silence). The motion frames that lead a clip bring their windows from the anchor of the
chunk that made them, so a frame's audio is computed once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import Tensor
from transformers import AutoTokenizer, Wav2Vec2FeatureExtractor

from gpu_worker.models.infinitetalk import layout
from gpu_worker.models.infinitetalk.checkpoint import InfiniteTalkWeights
from gpu_worker.models.infinitetalk.encoders import audio_windows, encode_audio, encode_text
from gpu_worker.models.infinitetalk.runtime import WanModule
from gpu_worker.pipeline.module import ContextGenerator
from gpu_worker.pipeline.types import AudioWindow, ChunkRequest

LOOK_AHEAD = 2  # frames: the window's half-width (audio_window 5)


def own_frames(chunk: ChunkRequest, stride: int) -> int:
    """The frames a chunk's latents stand for: the first chunk's first latent is one frame, every other four."""
    if chunk.first_frame == 0:
        return 1 + stride * -(-(chunk.n_frames - 1) // stride)
    return stride * -(-chunk.n_frames // stride)


class InfiniteTalkContext(WanModule, ContextGenerator):
    """Context keys: audio (F, window, layers, dim) tensor for the chunk's own frames; text, negative (512, dim)."""

    model_names = ("wav2vec", "t5")

    def __init__(self, weights: InfiniteTalkWeights) -> None:
        super().__init__(weights)
        self.margin_frames = (weights.config.stream.audio_context_frames + LOOK_AHEAD, LOOK_AHEAD)
        self._prompts: dict[tuple[str, str], tuple[Tensor, Tensor]] = {}

    def load(self) -> None:
        where = self.family_weights.locations
        # Local folders only: from_pretrained on a directory reads its files and never asks a hub.
        self.tokenizer = AutoTokenizer.from_pretrained(str(where.wan / layout.T5_TOKENIZER), local_files_only=True)
        self.features = Wav2Vec2FeatureExtractor.from_json_file(str(where.wav2vec / "preprocessor_config.json"))
        super().load()

    def context(self, window: AudioWindow, chunk: ChunkRequest, rng: np.random.Generator) -> dict[str, Any]:
        before, after = self.margin_frames
        frames = own_frames(chunk, self.settings.vae.temporal_stride)
        first, end = chunk.first_frame - before, chunk.first_frame + frames + after
        start, stop = window.frame_start(first), window.frame_start(end)
        samples = np.pad(window.samples, (0, max(0, stop - len(window.samples))))[start:stop]
        normalised = self.features(samples, sampling_rate=window.rate).input_values[0]  # zero mean, unit variance
        with self.running():
            features = encode_audio(self.models["wav2vec"], self.tensor(np.asarray(normalised))[None], end - first)  # type: ignore[arg-type]
        dit = self.settings.dit
        windows = audio_windows(features, before, frames, dit.audio_window, floor=-chunk.first_frame)
        text, negative = self._encode(chunk.prompt)
        return {"audio": windows, "text": text, "negative": negative}

    def _encode(self, prompt: str) -> tuple[Tensor, Tensor]:
        """The prompt's and the negative prompt's tokens, once per prompt and device."""
        key = (prompt, self.device)
        if key not in self._prompts:
            prompts = [prompt, self.settings.sampling.negative_prompt]
            with self.running():
                encoded = encode_text(self.models["t5"], self.tokenizer, prompts, self.settings.dit.text_len)  # type: ignore[arg-type]
            self._prompts = {key: (encoded[0], encoded[1])}
        return self._prompts[key]
