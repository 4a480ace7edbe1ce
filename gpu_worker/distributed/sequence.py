"""Ulysses sequence parallelism (SP): one model forward split across a node's ranks by its tokens.

Every rank receives the same full inputs. A model that supports SP (the dit family's audio-to-video and
super-resolution DiTs) asks `current_sp()`; with a group it keeps only its own contiguous run of frames
(`split_frames`: frame-aligned, as even as possible), runs projections, norms, MLPs and cross-attention on
those tokens alone, and around each self-attention swaps the sharding with an all-to-all:

    (B, heads, L_local, D) --seq_to_heads--> (B, heads / P, L_total, D) --attend--> --heads_to_seq--> back

so each rank attends over the whole sequence for 1/P of the heads, with any attention function (dense SDPA,
the SR's frame-window attention: its layout is the single-process one, since every rank then holds every
frame). At exit the model all-gathers its output (`gather_frames`), so every rank returns the full, identical
result, and roles and the pipeline never see the split. Without a group (`current_sp()` is None: the
default, any one-process run) the models take their single-process path unchanged.

Uneven splits. Frame counts rarely divide by P (and a rank may get no frame at all), so every collective
here takes each rank's size along the split dimension (`counts`) and uses `all_to_all_single` with
per-rank split sizes on flattened buffers (`gather_frames` pads to the largest slice, all-gathers and cuts
the padding off). Every rank knows the counts: they follow from the frame split, so nothing is exchanged.

Head-group pipelining. `SPGroup.head_groups` = G splits the heads into G groups; the all-to-alls of group
g + 1 are issued asynchronously (`async_op=True`) before group g's attention runs and are waited on just
before use, so communication overlaps attention (G = 1 is plain Ulysses). Heads are independent in
attention, so the result does not depend on G. P x G must divide the model's head count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

# (query, key, value) each (B, heads, L, head_dim) → (B, heads, L, head_dim)
Attend = Callable[[Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class SPGroup:
    """The ranks one model forward is split across. `rank` is this process's rank *in `group`*."""

    group: dist.ProcessGroup
    degree: int
    rank: int
    head_groups: int = 1

    def __post_init__(self) -> None:
        if self.degree < 1 or not 0 <= self.rank < self.degree:
            raise ValueError(f"SP rank {self.rank} is outside a group of degree {self.degree}")
        if self.head_groups < 1:
            raise ValueError(f"SP head_groups must be at least 1, got {self.head_groups}")


_CURRENT: ContextVar[SPGroup | None] = ContextVar("monologue_sequence_parallel", default=None)


@contextmanager
def sequence_parallel(sp: SPGroup | None) -> Iterator[None]:
    """Run the models called inside with sequence parallelism over `sp` (None: single-process)."""
    token = _CURRENT.set(sp)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_sp() -> SPGroup | None:
    """The group the models called now split their sequences across, or None."""
    return _CURRENT.get()


def split_frames(total_frames: int, degree: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) frame ranges, one per rank, as even as possible (the first ranks take the
    remainder); ranks past the last frame get empty ranges."""
    if degree < 1 or total_frames < 0:
        raise ValueError(f"cannot split {total_frames} frames over {degree} ranks")
    base, extra = divmod(total_frames, degree)
    ranges, start = [], 0
    for rank in range(degree):
        end = start + base + (1 if rank < extra else 0)
        ranges.append((start, end))
        start = end
    return ranges


@dataclass(frozen=True)
class FrameShard:
    """This rank's share of a frame-structured sequence (`frames` frames of `tokens_per_frame` tokens): what
    a model slices at entry, the token counts its all-to-alls take, and the counts its exit gather takes."""

    sp: SPGroup
    ranges: tuple[tuple[int, int], ...]  # [start, end) frames of every rank
    tokens_per_frame: int

    @classmethod
    def split(cls, sp: SPGroup, frames: int, tokens_per_frame: int) -> FrameShard:
        return cls(sp, tuple(split_frames(frames, sp.degree)), tokens_per_frame)

    @property
    def frames(self) -> tuple[int, int]:
        """This rank's [start, end) frames."""
        return self.ranges[self.sp.rank]

    @property
    def tokens(self) -> slice:
        """This rank's tokens in the whole sequence."""
        start, end = self.frames
        return slice(start * self.tokens_per_frame, end * self.tokens_per_frame)

    @property
    def token_counts(self) -> list[int]:
        return [(end - start) * self.tokens_per_frame for start, end in self.ranges]

    def frame_counts(self, first: int, end: int) -> list[int]:
        """Every rank's count of frames within [first, end) (the frames a model outputs, say)."""
        return [max(0, min(stop, end) - max(start, first)) for start, stop in self.ranges]

    def attend(self, inner: Attend) -> Attend:
        """`inner` (full-sequence attention) applied to this shard's tokens through `ulysses_attention`."""

        def attend(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
            return ulysses_attention(query, key, value, inner, self.token_counts, self.sp)

        return attend


def check_heads(model: str, heads: int, sp: SPGroup) -> None:
    """ValueError unless `heads` splits evenly over the SP degree and the head groups."""
    if heads % sp.degree:
        raise ValueError(
            f"{model} has {heads} attention heads, which do not split over a sequence-parallel degree of "
            f"{sp.degree}: use a degree that divides {heads} (MONOLOGUE_SP_DEGREE) or a checkpoint with more heads"
        )
    if heads % (sp.degree * sp.head_groups):
        raise ValueError(
            f"{model} has {heads} attention heads: {heads // sp.degree} per rank at degree {sp.degree} do not "
            f"split into {sp.head_groups} head groups (MONOLOGUE_SP_HEAD_GROUPS)"
        )


def gather_frames(local: Tensor, dim: int, counts: Sequence[int], sp: SPGroup) -> Tensor:
    """All-gather uneven slices along `dim` (rank r holds `counts[r]` entries there) → the full tensor, the
    ranks' slices in rank order, on every rank."""
    _check_counts(local, dim, counts, sp)
    largest = max(counts)
    padded = local
    if local.shape[dim] < largest:
        shape = list(local.shape)
        shape[dim] = largest - local.shape[dim]
        padded = torch.cat([local, local.new_zeros(shape)], dim=dim)
    pieces = [torch.empty_like(padded) for _ in range(sp.degree)]
    dist.all_gather(pieces, padded.contiguous(), group=sp.group)
    return torch.cat([piece.narrow(dim, 0, count) for piece, count in zip(pieces, counts, strict=True)], dim=dim)


class _Pending:
    """An asynchronous all-to-all and how to read its result once it has arrived."""

    def __init__(self, work: dist.Work | None, finish: Callable[[], Tensor]) -> None:
        self._work, self._finish = work, finish

    def wait(self) -> Tensor:
        if self._work is not None:
            self._work.wait()
        return self._finish()


def _start_seq_to_heads(x: Tensor, counts: Sequence[int], sp: SPGroup) -> _Pending:
    batch, heads, length, head_dim = x.shape
    per_rank = heads // sp.degree
    # Rank r's chunk of heads, laid out first so each destination's share is one contiguous run.
    send = x.reshape(batch, sp.degree, per_rank, length, head_dim).transpose(0, 1).contiguous().flatten()
    unit = batch * per_rank * head_dim
    receive = x.new_empty(unit * sum(counts))
    work = dist.all_to_all_single(
        receive,
        send,
        output_split_sizes=[unit * count for count in counts],
        input_split_sizes=[send.numel() // sp.degree] * sp.degree,
        group=sp.group,
        async_op=True,
    )

    def finish() -> Tensor:
        pieces = torch.split(receive, [unit * count for count in counts])
        return torch.cat([p.view(batch, per_rank, c, head_dim) for p, c in zip(pieces, counts, strict=True)], dim=2)

    return _Pending(work, finish)


def _start_heads_to_seq(y: Tensor, counts: Sequence[int], sp: SPGroup) -> _Pending:
    batch, per_rank, _, head_dim = y.shape
    send = torch.cat([part.flatten() for part in torch.split(y, list(counts), dim=2)])  # rank r's tokens, in rank order
    unit = batch * per_rank * head_dim
    local = counts[sp.rank]
    receive = y.new_empty(sp.degree * unit * local)
    work = dist.all_to_all_single(
        receive,
        send,
        output_split_sizes=[unit * local] * sp.degree,
        input_split_sizes=[unit * count for count in counts],
        group=sp.group,
        async_op=True,
    )

    def finish() -> Tensor:
        # (P, B, heads / P, L_local, D): rank r sent heads [r heads / P, (r + 1) heads / P).
        out = receive.view(sp.degree, batch, per_rank, local, head_dim).transpose(0, 1)
        return out.reshape(batch, sp.degree * per_rank, local, head_dim)

    return _Pending(work, finish)


def seq_to_heads(x: Tensor, counts: Sequence[int], sp: SPGroup) -> Tensor:
    """(B, heads, L_local, D), rank r holding `counts[r]` tokens → (B, heads / P, L_total, D): this rank's
    heads (the r-th run of heads / P) over the whole sequence."""
    _check_counts(x, 2, counts, sp)
    return _start_seq_to_heads(x, counts, sp).wait()


def heads_to_seq(y: Tensor, counts: Sequence[int], sp: SPGroup) -> Tensor:
    """The inverse of `seq_to_heads`: (B, heads / P, L_total, D) → (B, heads, L_local, D)."""
    return _start_heads_to_seq(y, counts, sp).wait()


def ulysses_attention(
    query: Tensor, key: Tensor, value: Tensor, attend: Attend, counts: Sequence[int], sp: SPGroup
) -> Tensor:
    """`attend` over the whole sequence for sequence-sharded (B, heads, L_local, D) inputs → (B, heads,
    L_local, D). `attend` sees (B, heads / (P G), L_total, D) tensors in the single-process token order.

    Head groups pipeline: group g + 1's all-to-alls are in flight while group g attends, and each group's
    output starts its way back as soon as it is ready."""
    _check_counts(query, 2, counts, sp)
    heads, groups = query.shape[1], sp.head_groups
    if heads % (sp.degree * groups):
        raise ValueError(f"{heads} heads do not split over degree {sp.degree} x {groups} head groups")

    def start(group: int) -> list[_Pending]:
        return [
            _start_seq_to_heads(part, counts, sp)
            for part in (t.chunk(groups, dim=1)[group] for t in (query, key, value))
        ]

    inputs = start(0)
    outputs: list[_Pending] = []
    for group in range(groups):
        following = start(group + 1) if group + 1 < groups else []
        q, k, v = (pending.wait() for pending in inputs)
        outputs.append(_start_heads_to_seq(attend(q, k, v).contiguous(), counts, sp))
        inputs = following
    return torch.cat([pending.wait() for pending in outputs], dim=1)


def _check_counts(x: Tensor, dim: int, counts: Sequence[int], sp: SPGroup) -> None:
    if len(counts) != sp.degree or x.shape[dim] != counts[sp.rank]:
        raise ValueError(
            f"rank {sp.rank} holds {x.shape[dim]} entries along dim {dim}, but the counts {list(counts)} say "
            f"{counts[sp.rank] if len(counts) == sp.degree else '?'} (one count per rank of {sp.degree})"
        )
