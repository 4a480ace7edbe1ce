"""The context: the speech → wav2vec2 windows per frame, the prompt and the negative prompt → umT5 tokens.

Audio (see encoders.py). A render's speech is encoded whole, once per session, as the original encodes its
utterance (`encode_speech`: one row per video frame of the speech, frames past its end read its last, as the
original clamps its indices to the embedding, multitalk.py line 530); the node stores the rows and each chunk reads
its frames' windows from them, so a frame's features never depend on the chunk plan or on which node resumed the
session. A live session's speech is still arriving, so each chunk runs wav2vec2 over its own frames plus
`audio_context_frames` before and the 2 its last window reads ahead (`margin_frames`; a live session stores 0.1 s
past a chunk, so reading further ahead would stall it), frames past the end hearing silence. Either way frame f's
window is the features of frames f-2..f+2, clamped at the video's first frame as the original clamps at its first.
The frames are the chunk's own latent span (a session's ragged last chunk: its last latent's frames past the end).
The motion frames that lead a clip bring their windows from the anchor of the chunk that made them, so a frame's
audio is computed once.
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
from gpu_worker.pipeline.types import AudioSource, AudioWindow, ChunkRequest, OutputSpec
from monologue.plan import frame_count

LOOK_AHEAD = 2  # frames: the window's half-width (audio_window 5)


def own_frames(chunk: ChunkRequest, stride: int) -> int:
    """The frames a chunk's latents stand for: the first chunk's first latent is one frame, every other four."""
    if chunk.first_frame == 0:
        return 1 + stride * -(-(chunk.n_frames - 1) // stride)
    return stride * -(-chunk.n_frames // stride)


class InfiniteTalkContext(WanModule, ContextGenerator):
    """Context keys: audio (F, window, layers, dim) tensor for the chunk's own frames; text, negative (512, dim)."""

    encodes_speech = True  # wav2vec2 over a render's whole speech, as the original
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

    def encode_speech(self, audio: AudioSource, output: OutputSpec) -> np.ndarray:
        """A render's whole speech → (frames, layers, dim) float32, one row per video frame of the speech (the
        session's frame count): the original's get_embedding over the whole utterance."""
        if audio.total_samples is None:
            raise ValueError("encode_speech needs a render's whole speech; a live session's chunks encode their own")
        frames = max(1, frame_count(audio.total_samples, rate=audio.rate, fps=output.fps))
        samples = audio.read(0, frames * audio.rate // output.fps)
        return self._wav2vec(samples, audio.rate, frames).cpu().numpy()

    def speech_range(self, chunk: ChunkRequest) -> tuple[int, int]:
        """The chunk's own latent span and the 2 frames either side its windows reach."""
        frames = own_frames(chunk, self.settings.vae.temporal_stride)
        return chunk.first_frame - LOOK_AHEAD, chunk.first_frame + frames + LOOK_AHEAD

    def context(self, window: AudioWindow, chunk: ChunkRequest, rng: np.random.Generator) -> dict[str, Any]:
        frames = own_frames(chunk, self.settings.vae.temporal_stride)
        if window.speech is not None:  # a render: its frames' rows of the whole speech's encoding
            before = LOOK_AHEAD
            features = self.tensor(window.speech.read(*self.speech_range(chunk)))
        else:  # a live session: its own audio with a second before
            before, after = self.margin_frames
            first, end = chunk.first_frame - before, chunk.first_frame + frames + after
            start, stop = window.frame_start(first), window.frame_start(end)
            samples = np.pad(window.samples, (0, max(0, stop - len(window.samples))))[start:stop]
            features = self._wav2vec(samples, window.rate, end - first)
        windows = audio_windows(features, before, frames, self.settings.dit.audio_window, floor=-chunk.first_frame)
        text, negative = self._encode(chunk.prompt)
        return {"audio": windows, "text": text, "negative": negative}

    def _wav2vec(self, samples: np.ndarray, rate: int, frames: int) -> Tensor:
        """samples → (frames, layers, dim) on the device: normalised (zero mean, unit variance), then wav2vec2."""
        normalised = self.features(samples, sampling_rate=rate).input_values[0]
        with self.running():
            return encode_audio(self.models["wav2vec"], self.tensor(np.asarray(normalised))[None], frames)  # type: ignore[arg-type]

    def _encode(self, prompt: str) -> tuple[Tensor, Tensor]:
        """The prompt's and the negative prompt's tokens, once per prompt and device."""
        key = (prompt, self.device)
        if key not in self._prompts:
            prompts = [prompt, self.settings.sampling.negative_prompt]
            with self.running():
                encoded = encode_text(self.models["t5"], self.tokenizer, prompts, self.settings.dit.text_len)  # type: ignore[arg-type]
            self._prompts = {key: (encoded[0], encoded[1])}
        return self._prompts[key]
