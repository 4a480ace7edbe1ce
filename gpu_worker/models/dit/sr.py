"""The super-resolution DiT: low-resolution latents → output-resolution latents in one pass.

The low-resolution latents are upsampled (nearest) and the transformer predicts the residual detail,
attending, frame by frame, to the frames within ± `window` and to the reference frame (the portrait's
own output-resolution latents): the reference supplies identity detail (eyes, teeth, hair) that the
low-resolution video no longer has, and the window keeps neighbouring frames consistent.

Each frame's tokens are padded with learned registers to a multiple of the attention block size, so
FlexAttention's blocks align with frame edges (see sparse_attention.py). Registers are ordinary tokens
(they attend and are attended to, like ViT registers); their outputs are dropped.

On the compiled FlexAttention path each attention call pads the sequence to a compile bucket
(`SRConfig.frame_buckets`, `bucket`); `warm_up` compiles every bucket when a node loads the model, so a
render never waits for a compile (and never falls back to eager flex after Dynamo's recompile limit).

Sequence parallelism (gpu_worker/distributed/sequence.py): under `current_sp()` each rank keeps a
contiguous, equal run of whole attention blocks (`block_size` tokens; a frame is a whole number of blocks, so
a rank may hold part of a frame, registers included) and attends through Ulysses all-to-alls: the attention
then sees every frame for its share of the heads, so the frame-window layout, its block mask and the compile
buckets are the single-process ones; only the head count per call shrinks (heads / (degree x head groups)),
which `warm_up` compiles for when it runs under the group. The tokens' outputs are all-gathered, so every
rank returns the whole result.
"""

from __future__ import annotations

from contextlib import ExitStack

import torch
from torch import Tensor, nn

from gpu_worker.distributed.sequence import SequenceShard, current_sp, gather_frames, model_group
from gpu_worker.models.dit.config import DiTConfig, SRConfig
from gpu_worker.models.dit.layers import AttendFn, TransformerBlock, grid_positions, patchify, rope_table, unpatchify
from gpu_worker.models.dit.sparse_attention import FrameWindow, bucket_frames, resolve_backend, window_attention

# Every (device, dtype, bucket, frame size) `warm_up` compiled in this process: Dynamo keeps at most
# `recompile_limit` (8 by default) compiled versions of one function and runs any further shape eagerly, so
# warm_up raises the limit to hold them all (two resolutions of five buckets would otherwise not fit).
_WARMED: set[tuple[object, ...]] = set()


def padded_tokens(real: int, block_size: int) -> int:
    """Tokens per frame after padding `real` patch tokens with registers to a multiple of the block."""
    return -(-real // block_size) * block_size


class SuperResolutionDiT(nn.Module):
    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        _check_buckets(config.sr)
        self.config = config.sr
        sr, channels = config.sr, config.latent_channels
        self.channels = channels
        self.embed = nn.Linear(channels * sr.patch**2, sr.dim)
        self.reference_type = nn.Parameter(torch.zeros(sr.dim))
        self.video_type = nn.Parameter(torch.zeros(sr.dim))
        self.registers = nn.Parameter(torch.zeros(sr.block_size, sr.dim))
        self.blocks = nn.ModuleList(TransformerBlock(sr.dim, sr.heads, sr.mlp_ratio) for _ in range(sr.layers))
        self.norm_out = nn.LayerNorm(sr.dim)
        self.head = nn.Linear(sr.dim, channels * sr.patch**2)
        nn.init.normal_(self.registers, std=0.02)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def layout(self, frames: int, height: int, width: int) -> FrameWindow:
        """The attention layout for `frames` video frames of output latents (height, width)."""
        sr = self.config
        real = (height // sr.patch) * (width // sr.patch)
        return FrameWindow(frames + 1, padded_tokens(real, sr.block_size), sr.window, sr.block_size)

    def bucket(self, frames: int) -> int:
        """The compile bucket (frames, the reference included) of a sequence of `frames` latent frames
        (decoder context included) on the compiled flex path; ValueError past the largest."""
        return bucket_frames(frames + 1, self.config.frame_buckets)

    def warm_up(
        self, height: int, width: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> tuple[int, ...]:
        """Compile the attention of every bucket for output latents (height, width), on the parameters'
        device and in their dtype unless given; call once after loading (see `warm_up`)."""
        parameter = next(self.parameters())
        return warm_up(self, height, width, device or parameter.device, dtype or parameter.dtype)

    def forward(self, low: Tensor, reference: Tensor) -> Tensor:
        """low (B, C, T, h, w), reference (B, C, H, W) with H = scale h → latents (B, C, T, H, W)."""
        sr = self.config
        batch, _, frames = low.shape[:3]
        height, width = reference.shape[-2:]
        base = low.repeat_interleave(sr.scale, dim=3).repeat_interleave(sr.scale, dim=4)  # (B, C, T, H, W)
        if base.shape[-2:] != (height, width):
            raise ValueError(
                f"low-resolution latents {tuple(low.shape)} do not upscale to the reference's {height}x{width}"
            )
        sequence = torch.cat([reference[:, :, None], base], dim=2)  # (B, C, 1 + T, H, W)
        tokens = self.embed(patchify(sequence, sr.patch))  # (B, 1 + T, P_real, D)
        types = torch.cat([self.reference_type[None], self.video_type[None].expand(frames, -1)])  # (1 + T, D)
        tokens = tokens + types[None, :, None]
        layout = self.layout(frames, height, width)
        real = tokens.shape[2]
        registers = self.registers[: layout.tokens_per_frame - real].expand(batch, frames + 1, -1, -1)
        tokens = torch.cat([tokens, registers], dim=2)  # (B, 1 + T, P, D)

        rows, columns = height // sr.patch, width // sr.patch
        times = torch.arange(frames + 1, device=low.device)
        positions = grid_positions(times, rows, columns).view(frames + 1, real, 3)  # (1 + T, P_real, 3)
        # Registers sit at their frame's time and at no particular place in it.
        register_positions = torch.zeros(frames + 1, layout.tokens_per_frame - real, 3, device=low.device)
        register_positions[..., 0] = times[:, None]
        positions = torch.cat([positions, register_positions], dim=1).view(-1, 3)  # (L, 3)
        rope = rope_table(positions, sr.dim // sr.heads, sr.rope_theta)

        def window(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
            return window_attention(query, key, value, layout, sr.attention, sr.frame_buckets)

        attend: AttendFn = window

        x = tokens.view(batch, layout.length, -1)  # (B, L, D)
        sp = current_sp()
        if sp is not None:  # this rank's attention blocks only; the attention still sees the whole layout
            sp = model_group("the super-resolution DiT", sr.heads, sp)
            shard = SequenceShard.split(sp, layout.length, sr.block_size)
            x, rope = x[:, shard.tokens], (rope[0][shard.tokens], rope[1][shard.tokens])
            attend = shard.attend(window)
        for block in self.blocks:
            x = block(x, rope, attend=attend)
        out = self.head(self.norm_out(x))  # (B, tokens here, C p p)
        if sp is not None:  # every rank's tokens in order: (B, L, C p p)
            out = gather_frames(out, 1, shard.token_counts, sp)
        out = out.view(batch, frames + 1, layout.tokens_per_frame, self.head.out_features)[:, :, :real]
        detail = unpatchify(out[:, 1:], sr.patch, self.channels, height, width)  # (B, C, T, H, W)
        return base + detail


def _heads_per_call(sr: SRConfig) -> int:
    """Heads one attention call sees: all of them, or under sequence parallelism one head group's share."""
    sp = current_sp()
    if sp is None:
        return sr.heads
    sp = model_group("the super-resolution DiT", sr.heads, sp)
    return sr.heads // (sp.degree * sp.head_groups)


def _check_buckets(sr: SRConfig) -> None:
    buckets = sr.frame_buckets
    if not buckets or min(buckets) < 2:
        raise ValueError(
            f"SRConfig.frame_buckets {buckets} must hold at least one frame count, each at least 2 (the reference "
            "and one latent)"
        )


def _keep_compiled(signatures: set[tuple[object, ...]]) -> None:
    """Raise Dynamo's recompile limit so every warmed kernel stays compiled (see `_WARMED`)."""
    _WARMED.update(signatures)
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # torch < 2.6
    setattr(config, name, max(int(getattr(config, name)), len(_WARMED)))


def warm_up(
    model_or_config: SuperResolutionDiT | DiTConfig,
    latent_height: int,
    latent_width: int,
    device: torch.device | str,
    dtype: torch.dtype,
) -> tuple[int, ...]:
    """Run the compiled attention once per bucket for output latents (latent_height, latent_width), so no
    chunk of a render compiles. Returns the buckets compiled: none where the backend is not compiled flex.

    Runs under no_grad and, below fp32, autocast to `dtype`, as `TorchModule.running()` does: Dynamo guards
    on the grad and autocast modes, and a warm-up in another mode would compile a kernel no render uses.
    Under `sequence_parallel(sp)` it compiles for the head count one rank's attention call sees under that
    group (heads / (degree x head groups)): the kernel is specialised to it too."""
    sr = model_or_config.config if isinstance(model_or_config, SuperResolutionDiT) else model_or_config.sr
    device = torch.device(device)
    if resolve_backend(sr.attention, device, sr.block_size) != "flex":
        return ()
    _check_buckets(sr)
    tokens = padded_tokens((latent_height // sr.patch) * (latent_width // sr.patch), sr.block_size)
    buckets = tuple(sorted(set(sr.frame_buckets)))
    heads = _heads_per_call(sr)
    _keep_compiled({(str(device), dtype, heads, sr.dim, tokens, frames) for frames in buckets})
    with ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        if dtype != torch.float32:
            stack.enter_context(torch.autocast(device.type, dtype=dtype))
        for frames in buckets:
            layout = FrameWindow(frames, tokens, sr.window, sr.block_size)
            size = (1, heads, layout.length, sr.dim // sr.heads)  # one sequence, as the SR role runs it
            query, key, value = (torch.zeros(size, device=device, dtype=dtype) for _ in range(3))
            window_attention(query, key, value, layout, "flex", buckets)
    return buckets
