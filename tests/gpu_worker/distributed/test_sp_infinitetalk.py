"""The infinitetalk family's SP paper model (gpu_worker/distributed/sp_infinitetalk.py): deterministic properties of
a model, not speed. Its counts are cached per process (`dit_pass_flops`, `vae_units`): seconds on the meta device."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner

from cli.main import main
from gpu_worker.distributed import sp_infinitetalk as model, sp_infinitetalk_table as table
from gpu_worker.models.infinitetalk import flops
from gpu_worker.models.infinitetalk.config import WAN_14B
from gpu_worker.models.infinitetalk.vae import DecodeStream
from monologue.contracts import SamplingPreset

DEGREES = (1, 2, 4, 8)
FAST_480 = model.Scenario(preset=SamplingPreset.FAST, resolution="480p")
QUALITY_480 = model.Scenario(preset=SamplingPreset.QUALITY, resolution="480p")


def test_one_rank_fast_dit_is_four_steps_of_the_measured_pass() -> None:
    """At P = 1 the fast 480p chunk's DiT is 4 steps x 1 pass x the measured 3.50 s (within 1 %), nothing exchanged;
    quality's is 40 x the measured batched step."""
    fast = model.model_rows(FAST_480, (1,))[0].chunk
    assert fast.dit_total_s == pytest.approx(4 * 3.50, rel=0.01)
    assert fast.comm_s == 0 and fast.launch_s == 0
    quality = model.model_rows(QUALITY_480, (1,))[0].chunk
    assert quality.dit_total_s == pytest.approx(40 * 10.644, rel=0.01)


@pytest.mark.parametrize("scenario", [FAST_480, QUALITY_480, replace(FAST_480, resolution="720p")])
def test_speedup_is_at_most_the_ranks_and_grows_with_them(scenario: model.Scenario) -> None:
    rows = model.model_rows(scenario, DEGREES)
    for row in rows:
        assert 1 <= row.speedup <= row.degree and 1 <= row.dit_speedup <= row.degree
    for before, after in itertools.pairwise(rows):
        assert after.speedup > before.speedup and after.dit_speedup > before.dit_speedup
        assert after.ttff_s < before.ttff_s


def test_launch_overhead_lowers_the_eight_rank_speedup() -> None:
    """The modelled launch overhead counts at P > 1 only: it leaves one rank alone and lowers the 8-rank speed-up."""
    with_launch = model.model_rows(FAST_480, (1, 8))
    without = model.model_rows(replace(FAST_480, launch=model.NO_LAUNCH), (1, 8))
    assert with_launch[0].chunk == without[0].chunk
    assert with_launch[1].chunk.launch_s > 0 and without[1].chunk.launch_s == 0
    assert with_launch[1].speedup < without[1].speedup
    assert with_launch[1].dit_speedup < without[1].dit_speedup


def test_launch_overhead_fits_the_one_rank_sp_layer() -> None:
    """The fitted line passes within 0.1 ms of each measured extra (SP path over the plain layer, by head groups)."""
    launch = model.LaunchOverhead.fitted()
    for groups, ms in model.MEASURED.sp_layer_ms:
        assert 1000 * launch.seconds(groups) == pytest.approx(ms - model.MEASURED.plain_layer_ms, abs=0.1)
    assert launch.per_group_ms > 0 and launch.base_ms > 0


def test_dit_count_extrapolated_from_two_layers_equals_flops_py() -> None:
    """1- and 2-layer counts extrapolated to 40 layers are flops.py's full count; 1825 TFLOP a 480p pass, as measured
    over the real forward on the H200."""
    full = flops.step_flops(WAN_14B, 832, 480, 21, WAN_14B.fast)
    assert model.dit_pass_flops("480p", 21, 1) == pytest.approx(full, rel=1e-9)
    assert model.dit_pass_flops("480p", 21, 1) / 1e12 == pytest.approx(model.MEASURED.pass_tflop, rel=1e-4)
    assert model.dit_pass_flops("480p", 21, 3) == pytest.approx(3 * full, rel=1e-6)  # quality's batch of three


@pytest.mark.parametrize(
    ("resolution", "per_frame"),
    [
        ("480p", {"condition": 0.0, "motion": 0.26, "decode": 3.39}),  # decoding from a kept stream state
        ("720p", {"condition": 0.0, "motion": 0.61, "decode": 7.86}),
    ],
)
def test_vae_counts_match_flops_py_per_frame(resolution: str, per_frame: dict[str, float]) -> None:
    """One rank's VAE work per N chunk is flops.py's counted table (docs/benchmarks.md, issue 16) to its rounding: the
    motion frames' encode (the decoder's own frames: no decode of their own) and the decode from the kept state; a
    steady N chunk encodes no I2V condition (its length's was encoded before)."""
    parts = model.vae_flops(replace(FAST_480, resolution=resolution), 72, 38, 1)
    assert {name: value / 72 / 1e12 for name, value in parts.items()} == pytest.approx(per_frame, abs=0.0051)


def test_only_n0_encodes_its_i2v_condition() -> None:
    """A steady N chunk reuses its length's condition (roles.ConditionCache); N0 encodes its own: flops.py's count."""
    first = model.vae_flops(FAST_480, FAST_480.first_frames, 0, 1)
    motion, own = FAST_480.latents(FAST_480.first_frames, 0)
    assert first["condition"] == pytest.approx(flops.condition_flops(WAN_14B, 832, 480, motion + own), rel=1e-9)
    assert first["condition"] > 0 and model.vae_flops(FAST_480, 72, 38, 1)["condition"] == 0


def test_a_kept_decode_state_leaves_the_chunks_own_latents() -> None:
    """flops.py's second figure: a node that kept N(k)'s decode state (vae.StreamStates) decodes N(k+1)'s 18 latents,
    none of them a stream's first, and primes none: 18 later-latent calls against 38 + 18 primed."""
    units = model.vae_units("480p")
    kept = flops.chunk_flops(WAN_14B, 832, 480, 72, WAN_14B.fast, 0, primed=False)  # 0 steps: no DiT counted
    primed = flops.chunk_flops(WAN_14B, 832, 480, 72, WAN_14B.fast, 0)
    assert kept["vae_decode"] == pytest.approx(18 * units.decode_next, rel=1e-9)
    assert primed["vae_decode"] == pytest.approx(units.decode(38 + 18), rel=1e-9)
    assert kept["dit"] == 0 and kept["vae_motion"] == primed["vae_motion"]


def test_decode_units_are_linear_in_calls() -> None:
    """A stream primed on 4 latents then decoding 3 costs the first latent + 6 later ones, counted directly."""
    units = model.vae_units("480p")
    from gpu_worker.models.infinitetalk.checkpoint import _vae

    with torch.device("meta"):
        stream = DecodeStream(_vae(WAN_14B))

        def run() -> None:
            stream.prime(torch.zeros(1, 16, 4, 60, 104))
            stream.decode(torch.zeros(1, 16, 3, 60, 104))

        assert flops._count(run) == pytest.approx(units.decode(7), rel=1e-9)


def test_decode_split_primes_every_rank() -> None:
    """With no decode states kept, under SP every rank primes on the 38 latents before its run: a steady chunk's
    decode at 8 ranks is 38 + 3 latent calls, not 56 / 8; N0's last rank primes on all before it, so N0's decode does
    not shrink. With states kept (the default) every rank decodes the chunk's 18 latents whole, at any degree."""
    units = model.vae_units("480p")
    unkept = replace(FAST_480, config=replace(WAN_14B, stream=replace(WAN_14B.stream, decoder_states=0)))
    assert model.vae_flops(unkept, 72, 38, 8)["decode"] == units.decode(38 + 3)
    assert model.vae_flops(unkept, 72, 38, 1)["decode"] == units.decode(38 + 18)
    assert model.vae_flops(unkept, 17, 0, 8)["decode"] == model.vae_flops(unkept, 17, 0, 1)["decode"]
    assert WAN_14B.stream.decoder_states > 0
    for degree in (1, 2, 8):
        assert model.vae_flops(FAST_480, 72, 38, degree)["decode"] == 18 * units.decode_next  # none a stream's first
        assert model.vae_flops(FAST_480, 17, 0, degree)["decode"] == units.decode(5)


def test_verdict_follows_the_figures() -> None:
    """At the Wan VAE's measured rate the VAE misses 25 fps at 8; with a free VAE the DiT's figures decide."""
    assert "25: MISSED" in table.describe(FAST_480, DEGREES)
    free = model.model_rows(replace(FAST_480, vae_tflops=1e9), DEGREES)[-1]
    assert free.fps >= 25 and "(>= 25: met)" in table.verdict(replace(FAST_480, vae_tflops=1e9), free)


def test_cli_prints_the_infinitetalk_table() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["bench", "sp", "--family", "infinitetalk", "--sampling-preset", "fast"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert (
        lines[0].startswith("MODEL (not measured): infinitetalk")
        and "VAE at 99 TFLOP/s: the Wan VAE's measured fp32 decode" in result.output
    )
    rows = [match[1] for line in lines if (match := re.match(r"\s+(\d+)\s+\d+\.\d+", line))]
    assert rows == ["1", "2", "4", "8"]
    assert "verdict at P = 8, 480p" in result.output
    data = json.loads(
        runner.invoke(
            main, ["bench", "sp", "--family", "infinitetalk", "--ranks", "1", "--ranks", "8", "--json"]
        ).output
    )
    assert [row["degree"] for row in data["rows"]] == [1, 8] and data["preset"] == "fast"
    refused = runner.invoke(main, ["bench", "sp", "--family", "infinitetalk", "--preset", "h200"])
    assert refused.exit_code != 0 and "--preset" in refused.output
    odd = runner.invoke(main, ["bench", "sp", "--family", "infinitetalk", "--ranks", "3"])
    assert odd.exit_code != 0 and "40 heads" in odd.output
