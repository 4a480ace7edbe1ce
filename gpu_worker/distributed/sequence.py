"""Ulysses sequence parallelism (SP): one model forward split across a node's ranks by its tokens.

Every rank receives the same full inputs. A model that supports SP (the dit family's audio-to-video and
super-resolution DiTs, the infinitetalk family's Wan DiT) asks `current_sp()`; with a group it keeps only its own
contiguous run of the token sequence (`SequenceShard`: split into equal runs of whole *units*, as even as possible:
single tokens for the A2V and Wan DiTs, 128-token attention blocks for the SR DiT), runs projections, norms, MLPs and
cross-attention on those tokens alone, and around each self-attention swaps the sharding with an all-to-all:

    (B, heads, L_local, D) --seq_to_heads--> (B, heads / P, L_total, D) --attend--> --heads_to_seq--> back

so each rank attends over the whole sequence for 1/P of the heads, with any attention function (dense SDPA,
the SR's frame-window attention: its layout, block mask and compile buckets are the single-process ones,
since after the exchange every rank holds every token of its heads, in the single-process order). A split
that cuts a frame is therefore harmless: only per-token work runs on the split, and each token carries its
own position, mask row and segment. At exit the model all-gathers its output (`gather_frames`), so every
rank returns the full, identical result, and roles and the pipeline never see the split. Without a group
(`current_sp()` is None: the default, any one-process run) the models take their single-process path
unchanged.

Why tokens, not frames: a 720p N chunk's A2V sequence is 13 latent frames; split on frame edges over 8 ranks
the busiest rank holds 2/13 of the tokens (30 % more than 1/8), and every per-token stage waits for it.

Uneven splits. Unit counts rarely divide by P (and a rank may get no unit at all), so every collective
here takes each rank's size along the split dimension (`counts`) and uses `all_to_all_single` with
per-rank split sizes on flattened buffers (`gather_frames` pads to the largest slice, all-gathers and cuts
the padding off). Every rank knows the counts: they follow from the split, so nothing is exchanged.

Head-group pipelining. `SPGroup.head_groups` = G splits the heads into G groups; each group's q, k and v are
projected on demand and go as one all-to-all (stacked), issued asynchronously (`async_op=True`) while the
next group is projected and the previous one attends, and each group's output starts back while the next
group attends (`UlyssesAttention`; G = 1 is plain Ulysses: two all-to-alls per attention). Heads are
independent in attention, so the result does not depend on G. G is the most: each model uses the largest count up to it
that splits its heads per rank (`model_group`; the h200 preset at P = 8 and G = 2: two groups in the A2V
DiT, 16 heads, one in the SR DiT, 8 heads).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import Tensor

# (query, key, value) each (B, heads, L, head_dim) → (B, heads, L, head_dim)
Attend = Callable[[Tensor, Tensor, Tensor], Tensor]
# A run of heads → that run's (query, key, value), each (B, heads in the run, L_local, head_dim): a
# self-attention's projections, computed on demand so each head group's exchange overlaps the next's projection.
Project = Callable[[slice], tuple[Tensor, Tensor, Tensor]]
# A run of heads and that run's attention output (B, heads in the run, L_local, head_dim) → its share of the
# output projection (B, L_local, D): the shares of all runs add up to the projection (bias aside).
Output = Callable[[slice, Tensor], Tensor]


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
    """Contiguous [start, end) ranges of `total_frames` items (frames, tokens, blocks, batches), one per rank,
    as even as possible (the first ranks take the remainder); ranks past the last item get empty ranges."""
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
class SequenceShard:
    """This rank's share of a token sequence split into `units` of `unit_tokens` tokens each (whole units per
    rank): what a model slices at entry, the token counts its all-to-alls take, and the counts its exit gather
    takes."""

    sp: SPGroup
    ranges: tuple[tuple[int, int], ...]  # [start, end) units of every rank
    unit_tokens: int

    @classmethod
    def split(cls, sp: SPGroup, tokens: int, unit_tokens: int = 1) -> SequenceShard:
        """Split `tokens` (a multiple of `unit_tokens`) as evenly as whole units allow."""
        if unit_tokens < 1 or tokens % unit_tokens:
            raise ValueError(f"a sequence of {tokens} tokens does not split into units of {unit_tokens}")
        return cls(sp, tuple(split_frames(tokens // unit_tokens, sp.degree)), unit_tokens)

    @property
    def tokens(self) -> slice:
        """This rank's tokens in the whole sequence."""
        start, end = self.ranges[self.sp.rank]
        return slice(start * self.unit_tokens, end * self.unit_tokens)

    @property
    def token_counts(self) -> list[int]:
        return [(end - start) * self.unit_tokens for start, end in self.ranges]

    def counts_within(self, first: int, end: int) -> list[int]:
        """Every rank's count of tokens within tokens [first, end) (the tokens a model outputs, say)."""
        unit = self.unit_tokens
        return [max(0, min(stop * unit, end) - max(start * unit, first)) for start, stop in self.ranges]

    def attend(self, inner: Attend) -> UlyssesAttention:
        """`inner` (full-sequence attention) applied to this shard's tokens through Ulysses all-to-alls."""
        return UlyssesAttention(inner, tuple(self.token_counts), self.sp)


def head_groups_for(heads: int, degree: int, wanted: int) -> int:
    """The head groups a model of `heads` heads runs with at SP degree `degree`: the largest count up to
    `wanted` (MONOLOGUE_SP_HEAD_GROUPS, the most) that splits its heads per rank. `heads % degree` must be 0."""
    return max(groups for groups in range(1, wanted + 1) if (heads // degree) % groups == 0)


def model_group(model: str, heads: int, sp: SPGroup) -> SPGroup:
    """`sp` with the head groups `model` runs with (`head_groups_for`); ValueError, naming the model and the
    setting, unless its heads split over the SP degree."""
    if heads % sp.degree:
        raise ValueError(
            f"{model} has {heads} attention heads, which do not split over a sequence-parallel degree of "
            f"{sp.degree}: use a degree that divides {heads} (MONOLOGUE_SP_DEGREE) or a checkpoint with more heads"
        )
    return replace(sp, head_groups=head_groups_for(heads, sp.degree, sp.head_groups))


def gather_frames(local: Tensor, dim: int, counts: Sequence[int], sp: SPGroup) -> Tensor:
    """All-gather uneven slices along `dim` (rank r holds `counts[r]` entries there) → the full tensor, the
    ranks' slices in rank order, on every rank."""
    return start_gather_frames(local, dim, counts, sp).wait()


def start_gather_frames(local: Tensor, dim: int, counts: Sequence[int], sp: SPGroup) -> _Pending:
    """`gather_frames`, issued asynchronously: `.wait()` returns the full tensor (so a caller can compute the
    next slice while this one travels)."""
    _check_counts(local, dim, counts, sp)
    largest = max(counts)
    padded = local
    if local.shape[dim] < largest:
        shape = list(local.shape)
        shape[dim] = largest - local.shape[dim]
        padded = torch.cat([local, local.new_zeros(shape)], dim=dim)
    pieces = [torch.empty_like(padded) for _ in range(sp.degree)]
    work = dist.all_gather(pieces, padded.contiguous(), group=sp.group, async_op=True)

    def finish() -> Tensor:
        return torch.cat([piece.narrow(dim, 0, count) for piece, count in zip(pieces, counts, strict=True)], dim=dim)

    return _Pending(work, finish)


class _Pending:
    """An asynchronous collective and how to read its result once it has arrived."""

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


@dataclass(frozen=True)
class UlyssesAttention:
    """Self-attention of a sequence-sharded input (rank r holds `counts[r]` tokens) through Ulysses
    all-to-alls: `inner` sees (B, heads / (P G), L_total, head_dim) tensors in the single-process token order.

    Head groups pipeline (G = `sp.head_groups`): group g + 1 is projected while group g's q, k and v (one
    all-to-all, stacked) are in flight; each group's output starts back as soon as it is attended, while the next
    group attends, and its share of the output projection runs as soon as it is back, while the next group's
    output travels. So only the first group's exchange (less the second group's projection) and the last
    group's return (less the earlier groups' output projections) are exposed (sp_model.exposed_all_to_all
    models this schedule)."""

    inner: Attend
    counts: tuple[int, ...]
    sp: SPGroup

    def __call__(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        """Already projected (B, heads, L_local, head_dim) inputs → (B, heads, L_local, head_dim)."""
        return self.projected(lambda run: (query[:, run], key[:, run], value[:, run]), query.shape[1])

    def projected(self, project: Project, heads: int, output: Output | None = None) -> Tensor:
        """The attention of `heads` heads whose projections `project` makes, one head group at a time. With
        `output`, each group's share of the output projection runs as soon as that group is back (while the
        next one travels) and their sum is returned; without, the heads' outputs (B, heads, L_local, head_dim)."""
        groups = self.sp.head_groups
        if heads % (self.sp.degree * groups):
            raise ValueError(f"{heads} heads do not split over degree {self.sp.degree} x {groups} head groups")
        per_group = heads // groups
        runs = [slice(group * per_group, (group + 1) * per_group) for group in range(groups)]

        def start(run: slice) -> _Pending:
            query, key, value = project(run)
            _check_counts(query, 2, self.counts, self.sp)
            stacked = torch.stack([query, key, value])  # (3, B, heads in the group, L_local, head_dim)
            return _start_seq_to_heads(stacked.flatten(0, 1), self.counts, self.sp)

        inputs = start(runs[0])
        returning: list[_Pending] = []
        for group in range(groups):
            following = start(runs[group + 1]) if group + 1 < groups else None  # projected while `inputs` travel
            arrived = inputs.wait()  # (3 B, heads in the group / P, L_total, head_dim)
            query, key, value = arrived.view(3, -1, *arrived.shape[1:]).unbind(0)
            returning.append(_start_heads_to_seq(self.inner(query, key, value).contiguous(), self.counts, self.sp))
            if following is not None:
                inputs = following
        if output is None:
            return torch.cat([pending.wait() for pending in returning], dim=1)
        total = output(runs[0], returning[0].wait())
        for run, pending in zip(runs[1:], returning[1:], strict=True):
            total = total + output(run, pending.wait())
        return total


def ulysses_attention(
    query: Tensor, key: Tensor, value: Tensor, attend: Attend, counts: Sequence[int], sp: SPGroup
) -> Tensor:
    """`attend` over the whole sequence for sequence-sharded (B, heads, L_local, D) inputs → (B, heads,
    L_local, D) (see `UlyssesAttention`)."""
    return UlyssesAttention(attend, tuple(counts), sp)(query, key, value)


def _check_counts(x: Tensor, dim: int, counts: Sequence[int], sp: SPGroup) -> None:
    if len(counts) != sp.degree or x.shape[dim] != counts[sp.rank]:
        raise ValueError(
            f"rank {sp.rank} holds {x.shape[dim]} entries along dim {dim}, but the counts {list(counts)} say "
            f"{counts[sp.rank] if len(counts) == sp.degree else '?'} (one count per rank of {sp.degree})"
        )
