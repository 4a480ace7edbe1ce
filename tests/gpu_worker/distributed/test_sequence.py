"""Ulysses sequence parallelism: the A2V and SR DiTs split over 2 and 4 gloo ranks return what one process
returns, for every head-group count, with and without FSDP2 sharding over the same ranks (and its host
offload); the all-to-alls invert each other on uneven splits (ranks with no frames included); a head count
that does not split raises an error naming the model.

One 4-rank world runs every scenario: degree 4 over all ranks, and degree 2 over ranks {0, 1} and {2, 3} at
once. Tolerance: fp32, max abs diff 1e-5 (each scenario also reports whether it was bit-identical)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh

from gpu_worker.distributed import RankContext, RankGroup, shard_model
from gpu_worker.distributed.sequence import (
    SPGroup,
    current_sp,
    gather_frames,
    heads_to_seq,
    seq_to_heads,
    sequence_parallel,
    split_frames,
)
from gpu_worker.models.dit.a2v import A2VConditioning, AudioToVideoDiT
from gpu_worker.models.dit.config import TINY, DiTConfig
from gpu_worker.models.dit.layers import randomise
from gpu_worker.models.dit.sr import SuperResolutionDiT
from tests.gpu_worker.distributed.worlds import attempt, spawn_world

TOLERANCE = 1e-5
RANKS = 4
# The tiny preset with 8 heads (head dim 8), so degree 2 takes 1, 2 and 4 head groups and degree 4 takes 1 and 2.
CONFIG = replace(TINY, a2v=replace(TINY.a2v, heads=8), sr=replace(TINY.sr, heads=8))
HEAD_GROUPS = {2: (1, 2, 4), 4: (1, 2)}

# A2V chunk shapes: (name, noisy latent frames, boundary latent times, batch); 4x4 latents = 4 tokens a frame.
A2V_CASES = (
    ("n_chunk", 3, (-2.0, -1.0), 1),
    ("i_chunk", 1, (-2.0, -1.0, 1.0, 2.0), 1),
    ("short_first_chunk", 1, (), 1),  # 2 frames in all: at degree 4 two ranks hold none
    ("short_last_chunk", 2, (-2.0, -1.0), 1),
    ("guided_with_text", 3, (-2.0, -1.0), 2),  # the guidance batch: conditional + unconditional, text tokens
)
# SR: (name, latent frames); 4x6 low latents → 8x12 output latents = 24 patch tokens + 8 registers a frame.
SR_CASES = (("one_frame", 1), ("three_frames", 3), ("six_frames", 6))
# The same SR DiT on FlexAttention with compile-bucket padding (7 frames → bucket 12), run eagerly: the
# compiled path's padding and block mask on CPU, without its 13-20 s compile.
SR_FLEX = replace(CONFIG, sr=replace(CONFIG.sr, attention="flex_eager"))
SR_FLEX_CASES = (("six_frames_flex", 6),)


def a2v_inputs(frames: int, boundary_times: tuple[float, ...], batch: int) -> tuple[Tensor, Tensor, A2VConditioning]:
    generator = torch.Generator().manual_seed(11 + frames + 10 * len(boundary_times) + 100 * batch)
    channels, audio = CONFIG.latent_channels, CONFIG.audio
    video_frames = 4 * frames + 4  # the chunk's video frames and a margin
    text_tokens = 3 if batch > 1 else 0
    cond = A2VConditioning(
        reference=torch.randn(batch, channels, 4, 4, generator=generator),
        boundary=torch.randn(batch, channels, len(boundary_times), 4, 4, generator=generator),
        boundary_times=torch.tensor(boundary_times),
        audio=torch.randn(batch, video_frames, audio.tokens_per_frame, audio.dim, generator=generator),
        audio_times=torch.arange(-2.0, video_frames - 2.0),
        text=torch.randn(batch, text_tokens, CONFIG.text.dim, generator=generator),
        text_mask=torch.ones(batch, text_tokens, dtype=torch.bool),
        keep_audio=torch.tensor([True, False][:batch]),
    )
    noisy = torch.randn(batch, channels, frames, 4, 4, generator=generator)
    return noisy, torch.full((batch,), 0.6), cond


def sr_inputs(frames: int) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(21 + frames)
    channels = CONFIG.latent_channels
    low = torch.randn(1, channels, frames, 4, 6, generator=generator)
    return low, torch.randn(1, channels, 8, 12, generator=generator)


def models(config: DiTConfig = CONFIG) -> tuple[AudioToVideoDiT, SuperResolutionDiT]:
    a2v, sr = AudioToVideoDiT(config), SuperResolutionDiT(config)
    randomise(a2v, 5)
    randomise(sr, 6)
    return a2v.eval().requires_grad_(False), sr.eval().requires_grad_(False)


def run_all(a2v: AudioToVideoDiT, sr: SuperResolutionDiT, sr_flex: SuperResolutionDiT) -> dict[str, np.ndarray]:
    with torch.no_grad():
        out = {name: a2v(*a2v_inputs(frames, times, batch)).numpy() for name, frames, times, batch in A2V_CASES}
        out |= {f"sr_{name}": sr(*sr_inputs(frames)).numpy() for name, frames in SR_CASES}
        out |= {f"sr_{name}": sr_flex(*sr_inputs(frames)).numpy() for name, frames in SR_FLEX_CASES}
    return out


def sp_group(context: RankContext, degree: int, head_groups: int = 1) -> SPGroup:
    """This rank's SP group of `degree` consecutive ranks (made once per degree, by every rank in order)."""
    groups: dict[int, list[dist.ProcessGroup]] = context.local.setdefault("sp_groups", {})
    if degree not in groups:
        starts = range(0, context.world_size, degree)
        groups[degree] = [dist.new_group(list(range(start, start + degree))) for start in starts]
    group = groups[degree][context.rank // degree]
    return SPGroup(group, degree, context.rank % degree, head_groups)


@dataclass(frozen=True)
class SPForwards:
    """Both DiTs single-process and under SP of `degree`, for every head-group count; with `sharded`, the
    SP runs also shard the models' blocks with FSDP2 over the SP group (with `offloaded`, their shards kept in
    host memory and copied in per block, FSDP2's offload policy)."""

    degree: int
    sharded: bool = False
    offloaded: bool = False

    def run(self, context: RankContext) -> dict[str, Any]:
        seen: dict[str, Any] = {"single": run_all(*models(), models(SR_FLEX)[1])}
        for head_groups in HEAD_GROUPS[self.degree]:
            sp = sp_group(context, self.degree, head_groups)
            a2v, sr = models()
            sr_flex = models(SR_FLEX)[1]
            if self.sharded:
                mesh = DeviceMesh.from_group(sp.group, "cpu")
                a2v, sr, sr_flex = (shard_model(m, mesh, host_offload=self.offloaded) for m in (a2v, sr, sr_flex))
            before = sp.group._get_sequence_number_for_group()  # type: ignore[attr-defined]
            with sequence_parallel(sp):
                seen[f"sp_g{head_groups}"] = run_all(a2v, sr, sr_flex)
            seen[f"collectives_g{head_groups}"] = sp.group._get_sequence_number_for_group() - before  # type: ignore[attr-defined]
            seen["after_context"] = current_sp() is None
        return seen


@dataclass(frozen=True)
class AllToAll:
    """seq_to_heads then heads_to_seq on uneven token counts (some ranks hold none) gives back the input,
    and the head-sharded tensor is the right slice of the whole; gather_frames rebuilds the whole."""

    degree: int

    def run(self, context: RankContext) -> dict[str, bool]:
        sp = sp_group(context, self.degree)
        counts = {2: [6, 3], 4: [6, 0, 3, 3]}[self.degree]
        whole = torch.randn(2, 8, sum(counts), 5, generator=torch.Generator().manual_seed(3))
        start = sum(counts[: sp.rank])
        local = whole[:, :, start : start + counts[sp.rank]].contiguous()
        heads = seq_to_heads(local, counts, sp)
        per_rank = 8 // self.degree
        return {
            "heads_slice": torch.equal(heads, whole[:, sp.rank * per_rank : (sp.rank + 1) * per_rank]),
            "round_trip": torch.equal(heads_to_seq(heads, counts, sp), local),
            "gathered": torch.equal(gather_frames(local, 2, counts, sp), whole),
        }


@dataclass(frozen=True)
class MismatchedHeads:
    """Per model: the error a head count that does not split over the degree raises, or with `head_groups`
    more than its heads per rank split into, the collectives one forward issued (the largest count that
    splits is used)."""

    heads: int
    degree: int
    head_groups: int = 1

    def run(self, context: RankContext) -> dict[str, str]:
        config = replace(TINY, a2v=replace(TINY.a2v, heads=self.heads), sr=replace(TINY.sr, heads=self.heads))
        a2v, sr = models(config)
        seen = {}
        sp = sp_group(context, self.degree, self.head_groups)
        with sequence_parallel(sp), torch.no_grad():
            for name, model, inputs in (("a2v", a2v, a2v_inputs(1, (), 1)), ("sr", sr, sr_inputs(1))):
                before = sp.group._get_sequence_number_for_group()  # type: ignore[attr-defined]
                try:
                    model(*inputs)
                    seen[name] = f"collectives {sp.group._get_sequence_number_for_group() - before}"  # type: ignore[attr-defined]
                except ValueError as err:
                    seen[name] = str(err)
        return seen


def drive(group: RankGroup) -> dict[str, Any]:
    steps: dict[str, Any] = {
        "sp2": SPForwards(2),
        "sp4": SPForwards(4),
        "sp2_sharded": SPForwards(2, sharded=True),
        "sp4_sharded": SPForwards(4, sharded=True),
        "sp2_offloaded": SPForwards(2, sharded=True, offloaded=True),
        "all_to_all2": AllToAll(2),
        "all_to_all4": AllToAll(4),
        "heads_2_over_4": MismatchedHeads(2, 4),
        "groups_over_heads": MismatchedHeads(8, 4, head_groups=4),
    }
    return {name: attempt(partial(group.gather_from_all, step)) for name, step in steps.items()}


@pytest.fixture(scope="module")
def sp_world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    results, others = spawn_world(drive, Path(tmp_path_factory.mktemp("sp")), ranks=RANKS, deadline_s=300)
    assert others == ["shutdown"] * (RANKS - 1)
    return results


def per_rank(results: dict[str, Any], name: str) -> list[Any]:
    attempted = results[name]
    assert "error" not in attempted, attempted.get("traceback")
    value: list[Any] = attempted["value"]
    return value


def compare(seen: dict[str, Any], key: str) -> tuple[dict[str, float], bool]:
    """Max abs difference of one SP run from the single-process run, per case; and bit-identity."""
    differences, identical = {}, True
    for case, single in seen["single"].items():
        assert np.abs(single).max() > 1e-3, f"{case}: an all-zero output proves nothing"
        assert seen[key][case].shape == single.shape, case
        differences[case] = float(np.abs(seen[key][case] - single).max())
        identical &= bool(np.array_equal(seen[key][case], single))
    return differences, identical


@pytest.mark.parametrize("name", ["sp2", "sp4", "sp2_sharded", "sp4_sharded", "sp2_offloaded"])
def test_sequence_parallel_dits_match_one_process(sp_world: dict[str, Any], name: str) -> None:
    for rank, seen in enumerate(per_rank(sp_world, name)):
        assert seen["after_context"], "sequence_parallel left its group set"
        for key in (key for key in seen if key.startswith("sp_g")):
            differences, identical = compare(seen, key)
            print(f"{name} rank {rank} {key}: max abs diff {max(differences.values()):.3g}, bit-identical {identical}")
            wrong = {case: difference for case, difference in differences.items() if difference > TOLERANCE}
            assert not wrong, (name, rank, key, wrong)


@pytest.mark.parametrize("name", ["sp2", "sp4"])
def test_every_block_swaps_q_k_v_and_the_output_per_head_group(sp_world: dict[str, Any], name: str) -> None:
    """Per forward: 2 all-to-alls (q, k and v stacked there, the output back) per head group in each of the 2
    layers, and one all-gather of the output; so the models really ran split (and G really splits the
    exchanges)."""
    forwards = len(A2V_CASES) + len(SR_CASES) + len(SR_FLEX_CASES)
    for seen in per_rank(sp_world, name):
        for head_groups in HEAD_GROUPS[int(name[2:])]:
            assert seen[f"collectives_g{head_groups}"] == forwards * (2 * 2 * head_groups + 1), head_groups


@pytest.mark.parametrize("name", ["sp2", "sp4"])
def test_head_groups_do_not_change_the_output(sp_world: dict[str, Any], name: str) -> None:
    for seen in per_rank(sp_world, name):
        runs = [seen[key] for key in seen if key.startswith("sp_g")]
        assert len(runs) >= 2
        for run in runs[1:]:
            for case, output in run.items():
                np.testing.assert_allclose(output, runs[0][case], rtol=0, atol=TOLERANCE, err_msg=case)


@pytest.mark.parametrize("name", ["all_to_all2", "all_to_all4"])
def test_all_to_alls_invert_each_other_on_uneven_splits(sp_world: dict[str, Any], name: str) -> None:
    for rank, checks in enumerate(per_rank(sp_world, name)):
        assert checks == {"heads_slice": True, "round_trip": True, "gathered": True}, rank


def test_a_head_count_that_does_not_split_names_the_model(sp_world: dict[str, Any]) -> None:
    for errors in per_rank(sp_world, "heads_2_over_4"):
        assert "audio-to-video DiT has 2 attention heads" in errors["a2v"] and "degree of 4" in errors["a2v"]
        assert "super-resolution DiT has 2 attention heads" in errors["sr"]


def test_more_head_groups_than_a_model_splits_into_use_the_largest_that_does(sp_world: dict[str, Any]) -> None:
    """8 heads at degree 4 are 2 a rank: MONOLOGUE_SP_HEAD_GROUPS=4 is the most, so each model runs 2 groups,
    2 all-to-alls each in each of its 2 layers, plus the output's gather."""
    for seen in per_rank(sp_world, "groups_over_heads"):
        assert seen == {"a2v": f"collectives {2 * 2 * 2 + 1}", "sr": f"collectives {2 * 2 * 2 + 1}"}, seen


def test_frames_split_contiguously_and_as_evenly_as_possible() -> None:
    assert split_frames(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert split_frames(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert split_frames(0, 2) == [(0, 0), (0, 0)]
    for total in range(12):
        for degree in (1, 2, 3, 4, 8):
            sizes = [end - start for start, end in split_frames(total, degree)]
            assert sum(sizes) == total and max(sizes) - min(sizes) <= 1


def test_without_a_group_nothing_is_split() -> None:
    assert current_sp() is None
    with sequence_parallel(None):
        assert current_sp() is None
