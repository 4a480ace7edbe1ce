"""A paper model of one node's time per chunk under Ulysses sequence parallelism (SP) over P GPUs: a MODEL,
not a measurement. Run `monologue bench sp` for the table.

Why a model: the figures issue 15 asks for (speed-up at 8 GPUs, fps of a seed-scale model) need eight H200s
we do not always have. The model multiplies counted work by measured one-GPU rates, so it is as good as its
two inputs and its stated assumptions, and it says where the time goes.

Work, counted (not estimated) with FlopCounterMode on the meta device by reusing `gpu_worker.models.dit.flops`,
and split the way the node splits it (Layout.DESIGN; the shares come from the models' own split functions):
- A2V and SR DiTs (SP'd): the self-attention core (the attention ops inside `Attention` modules) is split by
  heads, every rank attends over the whole sequence for heads / P, so it divides by P exactly. Everything
  else (projections, MLPs, cross-attention) runs on a rank's own tokens: the A2V splits its sequence by
  tokens, the SR in whole 128-token blocks (`SequenceShard`), so the busiest rank holds ceil(L / P) tokens
  (or blocks).
- VAE decode: the spatial stage in whole one-rank batches per rank (`spatial_batches`; one frame a batch in
  the h200 preset, so a 40-frame chunk is 5 frames a rank at P = 8 and a 4-frame I chunk busies 4 ranks);
  the temporal stage counted by its parts: each rank with frames primes (`VAEDecoder.prime`, the receptive
  field's triangle), runs the latent-rate stage on the latents behind its frames, and depth to time for its
  own frames only (`VAEDecoder.frame_features`). The context (audio encoder) stage is replicated.
Layout.BALANCED instead splits every stage evenly in its finest unit (tokens, pixel rows), priming and halos
neglected: a bound on what splitting alone could give, not built.

Time of one stage on the busiest rank:
    compute = overhead x (local FLOPs x share / local rate + attention FLOPs / P / attention rate)
where the rates are GPU_NOTES.md's: linear 751 TFLOP/s (bf16 matmul), A2V attention 618 (dense SDPA), SR
attention 426 useful TFLOP/s (frame-window flex), and `overhead` = 1.06, the measured DiT block (32.2 ms for
20.1 TFLOP at d=3072, 32,256 tokens) over the same FLOPs at those op rates (norms, RoPE, modulation). VAE
convolutions run at an ASSUMED half of the matmul rate (not measured). Small matrices lose rate: the linear
rate is scaled by m / (m + 256) for a rank's m rows (ASSUMED, normalised to 1 at the measured 32,256 rows).

All-to-all bytes (Ulysses). Per self-attention call the busiest rank holds L_r of the sequence's L tokens
(B sequences of width D, bf16 = 2 bytes). seq -> heads: it keeps its own heads' part, sends the other P - 1
head groups of its tokens, L_r x D x (P - 1) / P elements, and receives its heads of everyone else's tokens,
(L - L_r) x D / P elements. The return (heads -> seq) is the mirror. With q, k, v in and the output back
there are four such exchanges per layer, each moving per rank (both directions the same when L_r = L / P):

    bytes per exchange = 2 x B x D x max(L_r (P - 1) / P, (L - L_r) / P)     (= 2 B D L (P - 1) / P^2 even)
    bytes per layer    = 4 x bytes per exchange;  per A2V chunk: x layers x sampling steps

over NVLink at an ASSUMED 75 % of the per-GPU unidirectional 450 GB/s (900 GB/s aggregate), 337.5 GB/s, plus
an ASSUMED 25 us per collective (q, k and v go stacked as one collective, the output as another: as built).

Head-group pipelining (G groups of heads), as `UlyssesAttention.projected` runs it, simulated on two streams
(`exposed_all_to_all`): group g + 1 is projected while group g's q, k, v travel; each group attends as soon
as its inputs are in, its output travels back while the next group attends, and its share of the output
projection runs once it is back. Exposed: what the schedule's length adds to its compute, about the first
group's exchange less the next group's projection, plus the last group's return less the earlier groups'
output projections, plus any exchange longer than the compute it overlaps. Each group adds two latencies,
so past some G more groups expose more (the table uses the G you give, as the node does).

Also modelled: each SP'd stage's all-gather of its output ((P - 1) / P of it received per rank): the A2V's
latents after every sampling step, the SR's once, and the decoded frames (uint8) batch by batch in rounds
(`DiTDecoder.decode`: round i travels while the ranks decode batch i + 1, so only the last round and any
round longer than a batch's decode are exposed); optional FSDP2 weights (`fsdp=True`): each block's
bf16 weights all-gathered per block call, overlapped with the previous block's compute, exposed only where
the gather is longer. Not modelled: kernel launch gaps (assume CUDA graphs or compile), NCCL's use of SMs
during overlap, the host side (encode, publish). Importable with torch alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gpu_worker.distributed.sequence import head_groups_for, split_frames

BF16_BYTES = 2
# The measured DiT block of GPU_NOTES.md: d=3072, MLP 4x, 32,256 tokens, 32.2 ms.
_BLOCK_DIM, _BLOCK_TOKENS, _BLOCK_MS = 3072, 32_256, 32.2


@dataclass(frozen=True)
class Rates:
    """Per-op rates (TFLOP/s, GB/s): measured on one H200 (GPU_NOTES.md) unless named an assumption."""

    matmul_tflops: float = 751.0
    dense_attention_tflops: float = 618.0
    window_attention_tflops: float = 426.0
    conv_tflops: float = 375.0  # ASSUMPTION: half the matmul rate (VAE convolutions were not measured)
    nvlink_gbps: float = 0.75 * 450.0  # ASSUMPTION: 75 % of the per-GPU unidirectional NVLink bandwidth
    collective_latency_us: float = 25.0  # ASSUMPTION: per NCCL collective on one NVSwitch node
    gemm_half_rows: int = 256  # ASSUMPTION: a GEMM of m rows runs at m / (m + this) of its large-m rate

    @property
    def overhead(self) -> float:
        """Measured DiT block time over its FLOPs at the op rates: the element-wise work's share."""
        linear = 2 * _BLOCK_TOKENS * 12 * _BLOCK_DIM**2  # qkv + out (4 d^2) and MLP (8 d^2) per token
        attention = 4 * _BLOCK_TOKENS**2 * _BLOCK_DIM
        ideal_ms = 1e-9 * (linear / self.matmul_tflops + attention / self.dense_attention_tflops)
        return _BLOCK_MS / ideal_ms

    def gemm_efficiency(self, rows: int) -> float:
        def curve(m: int) -> float:
            return m / (m + self.gemm_half_rows)

        return min(1.0, curve(rows) / curve(_BLOCK_TOKENS)) if rows else 1.0


MAX_DEGREE = 16  # the SP degrees the model tabulates the node's splits for


@dataclass(frozen=True)
class StageWork:
    """One stage's counted work for one chunk. No `shares` and no `units`: replicated on every rank."""

    stage: str
    local_flops: float  # per-token work (projections, MLPs, convolutions): split across ranks under SP
    attention_flops: float  # self-attention core: split by heads under SP
    local_tflops: float
    attention_tflops: float
    overhead: float
    # Layout.DESIGN: the busiest rank's fraction of local_flops as the node splits this stage, at SP degree d
    # (shares[d - 1]); computed from the same split functions the models use (`design_shares`).
    shares: tuple[float, ...] = ()
    units: int = 0  # Layout.BALANCED: the finest even split (tokens, pixel rows), overheads neglected
    heads: int = 0  # attention heads (head groups must divide heads / P)
    tokens: int = 0  # one sequence's tokens; rows of a rank's GEMMs = batch x its share of them
    batch: int = 1
    dim: int = 0
    attention_calls: int = 0  # self-attention calls per chunk (layers x passes)
    # Of local_flops: the self-attentions' q, k, v projections (what head-group pipelining overlaps the input
    # all-to-all with) and output projections (what waits for the last group's return).
    projection_flops: float = 0.0
    out_projection_flops: float = 0.0
    output_bytes: float = 0.0  # the stage's whole output, all-gathered under SP (per pass)
    passes: int = 1  # forwards per chunk, each ending in that gather (the A2V's sampling steps)
    # Rounds the gather goes in at degree d (gather_rounds[d - 1]), each overlapping the next round's compute
    # (the decoder gathers batch by batch); () one gather at exit.
    gather_rounds: tuple[int, ...] = ()
    block_bytes: float = 0.0  # one block's bf16 weights (FSDP2 gathers them per block call)


@dataclass(frozen=True)
class StageTime:
    compute_s: float
    exposed_comm_s: float  # all-to-all, exit gather and FSDP gathers not hidden behind compute
    all_to_all_bytes: float  # per rank, whole chunk

    @property
    def total_s(self) -> float:
        return self.compute_s + self.exposed_comm_s


def exchange_bytes(tokens: int, local_tokens: int, dim: int, degree: int, batch: int = 1) -> float:
    """Bytes one all-to-all exchange (q, k, v or the output) moves on a rank holding `local_tokens` of
    `tokens`: the larger of what it sends and receives (see the module docstring)."""
    if degree == 1:
        return 0.0
    send = local_tokens * (degree - 1) / degree
    receive = (tokens - local_tokens) / degree
    return BF16_BYTES * batch * dim * max(send, receive)


def exposed_all_to_all(
    in_s: float,
    out_s: float,
    attention_s: float,
    groups: int,
    latency_s: float,
    projection_s: float = 0.0,
    out_projection_s: float = 0.0,
) -> float:
    """Exposed seconds of one self-attention's all-to-alls (in: q, k, v; out: the output) with `groups` head
    groups, from its schedule on two streams, as `UlyssesAttention.projected` issues it: the compute stream runs
    each group's q, k, v projection, then each group's attention, then each group's share of the output
    projection (its columns) once that group is back; the communication stream runs each exchange, in the
    order issued, once its input exists (group g's input right after its projection, its output right after
    its attention). Each exchange costs its bytes' share plus one latency. Exposed = the schedule's length
    minus its compute (projections, attention)."""
    compute, comm, arrived = 0.0, 0.0, []
    for _ in range(groups):
        compute += projection_s / groups
        comm = max(compute, comm) + in_s / groups + latency_s
        arrived.append(comm)
    returned = []
    for group in range(groups):
        compute = max(compute, arrived[group]) + attention_s / groups
        comm = max(compute, comm) + out_s / groups + latency_s
        returned.append(comm)
    for group in range(groups):
        compute = max(compute, returned[group]) + out_projection_s / groups
    return compute - (projection_s + attention_s + out_projection_s)


class Layout(StrEnum):
    """How work is split across ranks. DESIGN: what the node implements (the DiTs' sequences split by tokens,
    the SR's in whole 128-token attention blocks; the decode in whole spatial batches, each rank's temporal
    stage on the latents behind its frames after priming from the ones before). BALANCED: every stage split
    evenly in its finest unit (the decode by pixel rows, halos and priming neglected): a bound, not built."""

    DESIGN = "design"
    BALANCED = "balanced"


def largest_part(units: int, degree: int) -> int:
    return max(end - start for start, end in split_frames(units, degree))


def busiest_share(work: StageWork, degree: int, layout: Layout = Layout.DESIGN) -> float:
    """The fraction of a stage's per-token work on the busiest rank (1.0: replicated or one GPU)."""
    if degree == 1 or not (work.shares or work.units):
        return 1.0
    if layout is Layout.BALANCED and work.units:
        return largest_part(work.units, degree) / work.units
    if degree > len(work.shares):
        raise ValueError(f"the model tabulates SP degrees up to {len(work.shares)}, not {degree}")
    return work.shares[degree - 1]


def stage_time(
    work: StageWork,
    degree: int,
    rates: Rates,
    head_groups: int = 1,
    fsdp: bool = False,
    layout: Layout = Layout.DESIGN,
) -> StageTime:
    """The busiest rank's time for one stage at SP degree `degree` (1: one GPU, nothing exchanged)."""
    share = busiest_share(work, degree, layout)
    split = share < 1.0 or (degree > 1 and work.attention_calls > 0)
    heads_share = 1 / degree if split else 1.0
    tokens = work.tokens
    local_tokens = round(share * tokens)
    local_rate = work.local_tflops * (rates.gemm_efficiency(work.batch * local_tokens) if tokens else 1.0)
    attention_s = work.overhead * 1e-12 * work.attention_flops * heads_share / work.attention_tflops
    compute_s = work.overhead * 1e-12 * work.local_flops * share / local_rate + attention_s
    if not split:
        return StageTime(compute_s, 0.0, 0.0)
    latency, bandwidth = 1e-6 * rates.collective_latency_us, 1e9 * rates.nvlink_gbps
    exposed, moved = 0.0, 0.0
    if work.attention_calls:
        if work.heads % degree:
            raise ValueError(
                f"{work.stage} has {work.heads} attention heads: they do not split over an SP degree of {degree}"
            )
        groups = head_groups_for(work.heads, degree, head_groups)
        one = exchange_bytes(tokens, local_tokens, work.dim, degree, work.batch)
        calls = work.attention_calls
        per_call = [
            work.overhead * 1e-12 * flop * share / local_rate / calls
            for flop in (work.projection_flops, work.out_projection_flops)
        ]
        layer = exposed_all_to_all(
            3 * one / bandwidth, one / bandwidth, attention_s / calls, groups, latency, *per_call
        )
        exposed += work.attention_calls * layer
        moved = 4 * one * work.attention_calls
    if work.output_bytes:  # the output's all-gather, per pass; in rounds, all but the last behind compute
        rounds = work.gather_rounds[degree - 1] if work.gather_rounds else 1
        gather = work.output_bytes * (degree - 1) / degree / bandwidth / rounds + latency
        behind = compute_s / work.passes / rounds  # the compute each round but the last overlaps
        exposed += work.passes * (gather + (rounds - 1) * max(0.0, gather - behind))
    if fsdp and work.block_bytes and work.attention_calls:
        gather = work.block_bytes * (degree - 1) / degree / bandwidth + latency
        exposed += work.attention_calls * max(0.0, gather - compute_s / work.attention_calls)
    return StageTime(compute_s, exposed, moved)
