"""The three conditioning encoders, from transformers, fed as the original feeds them.

- Text (`wan/modules/t5.py` T5EncoderModel.__call__, lines 528-535; tokenizers.py): the prompt cleaned (HTML
  entities unescaped twice, whitespace collapsed), tokenised to 512 with padding and </s>, run through umT5's
  encoder with the padding masked, cut to its real tokens, then zero-padded to 512 again (the DiT's
  text_embedding sees those zeros and attends to them: multitalk_model.py lines 640-646, as diffusers' Wan
  pipelines do). The cleaning is tokenizers.py's basic_clean + whitespace_clean, `ftfy.fix_text` (NFC, mojibake
  repair, quote uncurling) included, so a prompt tokenises as the original's does.
- Image (`wan/modules/clip.py` CLIPModel.visual, lines 527-542): the reference frame in [-1, 1], bicubic to
  224 x 224 (no crop, no antialias), to [0, 1], normalised with OpenAI CLIP's mean and deviation, then the
  output of block 31 of 32 (257 tokens of 1280).
- Audio (`generate_infinitetalk.py` get_embedding, lines 323-346; `src/audio_analysis/wav2vec2.py`): the
  feature extractor's normalisation, the convolutional features linearly interpolated (align_corners) to one per
  video frame *before* the transformer, every hidden state after the first (12 x 768 per frame). The original
  runs this over the whole speech at once (after a loudness normalisation that the feature extractor's own
  normalisation cancels), and so does a render (`InfiniteTalkContext.encode_speech`, once per session, the rows
  stored and read back by each chunk). A live session cannot (its speech is still arriving): each chunk runs it
  over its own audio with a second of left context (`StreamConfig.audio_context_frames`) and the 2 frames its last
  window reads ahead, normalised on its own — the one deviation left, live only.
"""

from __future__ import annotations

import html
import re

import ftfy
import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import CLIPVisionModel, UMT5EncoderModel, Wav2Vec2Model

from gpu_worker.models.infinitetalk.runtime import own_precision

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def clean_prompt(text: str) -> str:
    """tokenizers.py basic_clean + whitespace_clean."""
    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return re.sub(r"\s+", " ", text).strip()


def encode_text(model: UMT5EncoderModel, tokenizer: object, prompts: list[str], length: int) -> Tensor:
    """prompts → (len(prompts), length, dim) float32: each prompt's real tokens, zeros after them."""
    batch = tokenizer(  # type: ignore[operator]
        [clean_prompt(prompt) for prompt in prompts],
        padding="max_length",
        truncation=True,
        max_length=length,
        add_special_tokens=True,
        return_tensors="pt",
    )
    device = next(model.parameters()).device
    ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
    hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()  # (B, length, dim)
    return hidden * mask[:, :, None].to(hidden.dtype)  # the original cuts at the real length, then pads zeros


def encode_image(model: CLIPVisionModel, image: Tensor, size: int) -> Tensor:
    """image (B, 3, H, W) in [-1, 1] → (B, tokens, dim) float32, the last block's output (the model has 31)."""
    pixels = F.interpolate(image.float(), size=(size, size), mode="bicubic", align_corners=False)
    mean = torch.tensor(CLIP_MEAN, device=pixels.device).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD, device=pixels.device).view(1, 3, 1, 1)
    pixels = ((pixels * 0.5 + 0.5) - mean) / std
    dtype = next(model.parameters()).dtype
    with own_precision(model, pixels.device):  # fp16 as the original's CLIP (`InfiniteTalkConfig.clip_precision`)
        return model(pixel_values=pixels.to(dtype)).last_hidden_state.float()


def encode_audio(model: Wav2Vec2Model, samples: Tensor, frames: int) -> Tensor:
    """Normalised samples (1, S) → per video frame, every hidden state after the first: (frames, layers, dim)."""
    dtype = next(model.parameters()).dtype
    features = model.feature_extractor(samples.to(dtype)).transpose(1, 2)  # (1, S', 512) at 50 Hz
    features = F.interpolate(features.transpose(1, 2), size=frames, mode="linear", align_corners=True)
    hidden, _ = model.feature_projection(features.transpose(1, 2))  # (1, frames, D)
    # Wav2Vec2Encoder.forward's steps (no mask: one unpadded input), keeping every layer's output, which is what
    # hidden_states[1:] holds (transformers records them with hooks on the model's forward, not the encoder's).
    encoder = model.encoder
    hidden = encoder.dropout(encoder.layer_norm(hidden + encoder.pos_conv_embed(hidden)))
    states = []
    for layer in encoder.layers:
        output = layer(hidden, attention_mask=None)
        hidden = output[0] if isinstance(output, tuple) else output
        states.append(hidden)
    return torch.stack(states, dim=2)[0].float()  # (frames, layers, D)


def audio_windows(features: Tensor, first: int, count: int, window: int, floor: int) -> Tensor:
    """features (F, K, C) for frames [origin, origin + F) relative to `first` at index `first`; the windows of
    frames [0, count): frame f gets frames f - window//2 .. f + window//2, each clamped at `floor` (the video's
    first frame, relative: the original clamps its indices to the audio, multitalk.py line 530) →
    (count, window, K, C)."""
    half = window // 2
    offsets = torch.arange(count)[:, None] + torch.arange(-half, half + 1)[None]  # (count, window)
    offsets = offsets.clamp(min=floor) + first
    return features[offsets.clamp(0, features.shape[0] - 1)]
