"""`monologue bench sp`: the SP paper models' tables, per family (a MODEL, not a measurement: the dit family's in
gpu_worker/distributed/sp_table.py, the infinitetalk family's in sp_infinitetalk.py). The options each family takes
are checked here, so a dit-only option given with `--family infinitetalk` fails instead of being ignored."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from monologue.contracts import Family, SamplingPreset

SP_FAMILIES = (Family.DIT, Family.INFINITETALK)


@dataclass(frozen=True)
class SpOptions:
    """`bench sp`'s options as given; None: not given (each family has its own default)."""

    family: Family
    ranks: tuple[int, ...]
    head_groups: int
    as_json: bool
    preset: str | None = None
    resolution: str | None = None
    n_frames: int | None = None
    i_frames: int | None = None
    layout: str | None = None
    fsdp: bool = False
    sampling_preset: SamplingPreset | None = None
    first_frames: int | None = None
    vae_tflops: float | None = None


def _refuse(family: Family, given: dict[str, object]) -> None:
    named = [f"--{name.replace('_', '-')}" for name, value in given.items() if value not in (None, False)]
    if named:
        raise ValueError(f"not for --family {family}: {', '.join(named)}")


def sp_table(options: SpOptions) -> str:
    """The table (or JSON) for the options' family; ValueError naming an option the family does not take."""
    degrees = tuple(sorted(set(options.ranks)))
    if options.family is Family.INFINITETALK:
        return _infinitetalk(options, degrees)
    _refuse(
        options.family,
        {
            "sampling_preset": options.sampling_preset,
            "first_frames": options.first_frames,
            "vae_tflops": options.vae_tflops,
        },
    )
    from gpu_worker.distributed.sp_model import Layout
    from gpu_worker.distributed.sp_table import Scenario, describe, report, scenario_config

    scenario = Scenario(
        scenario_config(options.preset or "h200"),
        options.resolution or "720p",
        n_frames=options.n_frames or 40,
        i_frames=4 if options.i_frames is None else options.i_frames,
        head_groups=options.head_groups,
        fsdp=options.fsdp,
        layout=Layout(options.layout or Layout.DESIGN),
    )
    return json.dumps(report(scenario, degrees)) if options.as_json else describe(scenario, degrees)


def _infinitetalk(options: SpOptions, degrees: tuple[int, ...]) -> str:
    _refuse(
        options.family,
        {"preset": options.preset, "i_frames": options.i_frames, "layout": options.layout, "fsdp": options.fsdp},
    )
    from gpu_worker.distributed import sp_infinitetalk as model
    from gpu_worker.distributed.sp_infinitetalk_table import describe, report
    from gpu_worker.models.infinitetalk.flops import SIZES

    if options.resolution not in (None, *SIZES):
        raise ValueError(f"--resolution {options.resolution}: infinitetalk's are {', '.join(SIZES)}")
    scenario = model.Scenario(
        preset=options.sampling_preset or SamplingPreset.FAST,
        resolution=options.resolution or "480p",
        chunk_frames=options.n_frames or 72,
        first_frames=options.first_frames or 17,
        head_groups=options.head_groups,
    )
    if options.vae_tflops is not None:
        scenario = replace(scenario, vae_tflops=options.vae_tflops)
    return json.dumps(report(scenario, degrees)) if options.as_json else describe(scenario, degrees)
