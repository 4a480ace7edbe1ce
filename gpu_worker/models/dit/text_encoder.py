"""A small byte-level text encoder for the optional scene prompt ("smiling, studio light").

Bytes, not a learned tokenizer: nothing to download or version, any language or emoji encodes, and a
few hundred bytes is a short sequence for a prompt. Token 0 is padding; byte b is token b + 1. The
output conditions the audio-to-video DiT through its cross-attention, next to the audio tokens.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from gpu_worker.models.dit.config import TextConfig
from gpu_worker.models.dit.layers import TransformerBlock, rope_table

VOCABULARY = 257  # padding + 256 byte values


def byte_tokens(prompt: str, max_bytes: int) -> np.ndarray:
    """(L,) int64 token ids of the prompt's UTF-8 bytes, cut to `max_bytes`; empty for an empty prompt."""
    data = prompt.strip().encode("utf-8")[:max_bytes]
    return np.frombuffer(data, dtype=np.uint8).astype(np.int64) + 1


class TextEncoder(nn.Module):
    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(VOCABULARY, config.dim)
        self.blocks = nn.ModuleList(TransformerBlock(config.dim, config.heads) for _ in range(config.layers))
        self.norm_out = nn.LayerNorm(config.dim)

    def forward(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """tokens (B, L) int64, 0 for padding → (embeddings (B, L, dim), mask (B, L) bool of real tokens)."""
        mask = tokens > 0
        x = self.embed(tokens)  # (B, L, dim)
        positions = torch.arange(tokens.shape[1], device=tokens.device, dtype=torch.float32)[:, None]
        rope = rope_table(positions, self.config.dim // self.config.heads, 10_000.0)
        attention_mask = mask[:, None, None, :]  # (B, 1, 1, L): every token ignores the padding
        for block in self.blocks:
            x = block(x, rope, attention_mask)
        return self.norm_out(x), mask
