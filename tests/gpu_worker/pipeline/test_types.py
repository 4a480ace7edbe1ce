"""The engine takes the session options' types and defaults from `RenderOptions`, their one definition."""

from __future__ import annotations

import dataclasses
from typing import get_type_hints

import pytest

from gpu_worker.pipeline import ChunkRequest, OutputSpec, frame_size, types as engine_types
from monologue.contracts import Chunk, ChunkKind, LipSync, RenderOptions, Resolution

CHUNK = Chunk(ChunkKind.N, 0, 0, 8)


def test_the_engine_s_defaults_are_render_options_own() -> None:
    defaults = RenderOptions()
    assert OutputSpec() == OutputSpec.of(defaults)
    assert ChunkRequest(CHUNK) == ChunkRequest.of(CHUNK, defaults)
    options_types = get_type_hints(RenderOptions)
    for spec in (OutputSpec, ChunkRequest):
        shared = [field for field in dataclasses.fields(spec) if field.name in options_types]
        assert shared, spec
        for field in shared:
            name = f"{spec.__name__}.{field.name}"
            assert get_type_hints(spec)[field.name] == options_types[field.name], name
            assert field.default == getattr(defaults, field.name), name


def test_a_session_s_options_reach_the_engine_whole() -> None:
    options = RenderOptions(fps=30, resolution=Resolution.HD_720, preview=True, seed=9, prompt="calm", sampling_steps=7)
    assert OutputSpec.of(options) == OutputSpec(fps=30, resolution=Resolution.HD_720, preview=True)
    request = ChunkRequest.of(CHUNK, RenderOptions(lip_sync=LipSync.VISEMES, seed=9))
    assert (request.seed, request.lip_sync) == (9, LipSync.VISEMES)
    request = ChunkRequest.of(CHUNK, options)
    assert (request.prompt, request.sampling_steps, request.lip_sync) == ("calm", 7, LipSync.LOUDNESS)


def test_resolution_is_the_contracts_enum() -> None:
    assert engine_types.Resolution is Resolution
    assert OutputSpec(resolution="720p").resolution is Resolution.HD_720  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'4k' is not a valid Resolution"):
        OutputSpec(resolution="4k")  # type: ignore[arg-type]
    assert frame_size(600, 800, OutputSpec(resolution=Resolution.HD_720)) == (720, 1280)
    assert frame_size(801, 601, OutputSpec(preview=True)) == (400, 300)


def test_a_size_asked_for_is_the_frame_size_whatever_the_portrait_and_preview_halves_it_to_even() -> None:
    options = RenderOptions(width=482, height=642, preview=True)
    assert OutputSpec.of(options) == OutputSpec(width=482, height=642, preview=True)
    for portrait in ((1920, 1080), (300, 900)):
        assert frame_size(*portrait, OutputSpec(width=480, height=640)) == (480, 640)
        assert frame_size(*portrait, OutputSpec.of(options)) == (240, 320)  # 241x321, rounded down to even
