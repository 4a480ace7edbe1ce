"""The pipeline's residency (RESIDENT or SWITCH) and the dit family's precision, on CPU with the tiny preset.

On CPU the ModelSwitcher really frees and refills the weights' storages, so "only the running stage's
models hold memory" is observable: a parameter of a parked model views a storage of 0 bytes."""

from __future__ import annotations

import gc
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gpu_worker.models import build_family as build_family_by_name
from gpu_worker.models.dit import SMOKE_SEED, build_family
from gpu_worker.models.dit.checkpoint import Weights
from gpu_worker.models.dit.config import TINY
from gpu_worker.models.dit.runtime import Precision
from gpu_worker.pipeline import ArrayAudio, ChunkRequest, ModelSet, OutputSpec, Pipeline
from gpu_worker.pipeline.module import Role
from gpu_worker.pipeline.pipeline import SWITCH_KEY, Session
from gpu_worker.pipeline.stages import DEFAULT_STAGES, ChunkState, Stage
from monologue.contracts import Chunk, ChunkKind, Family, LipSync, Residency

# Generation order N0 N1 I0, boundaries on multiples of the VAE's temporal stride (4).
CHUNKS = [
    ChunkRequest(Chunk(ChunkKind.N, 0, 0, 8), seed=5, lip_sync=LipSync.VISEMES),
    ChunkRequest(Chunk(ChunkKind.N, 1, 12, 8), seed=5, lip_sync=LipSync.VISEMES),
    ChunkRequest(Chunk(ChunkKind.I, 0, 8, 4), seed=5, lip_sync=LipSync.VISEMES),
]


@dataclass
class Run:
    """A render of CHUNKS: per chunk its frame hashes and stage_ms; per stage run, every role's device bytes
    just before and just after it; N0's frames."""

    hashes: list[list[str]] = field(default_factory=list)
    stage_ms: list[dict[str, float]] = field(default_factory=list)
    seen: list[tuple[Role, dict[Role, int], dict[Role, int]]] = field(default_factory=list)
    first_frames: list[np.ndarray] = field(default_factory=list)
    live: list[tuple[Role, int]] = field(default_factory=list)  # (stage's role, live CPU bytes just after it)
    residency: Residency = Residency.RESIDENT


class Sink:
    def __init__(self, frames: list[np.ndarray] | None = None) -> None:
        self.frames = frames

    def write(self, frames: np.ndarray) -> None:
        if self.frames is not None:
            self.frames.append(frames.astype(np.float64))


def portrait() -> np.ndarray:
    y, x = np.mgrid[0:60, 0:80]
    return np.stack([x * 3, y * 4, np.full_like(x, 90)], axis=-1).astype(np.uint8)


def audio() -> ArrayAudio:
    return ArrayAudio(np.random.default_rng(2).normal(scale=0.1, size=16_000 * 2).astype(np.float32))


def tiny(precision: Precision = Precision.AUTO) -> ModelSet:
    return build_family(Weights(TINY, seed=SMOKE_SEED), precision)


def held_models(holder: object, depth: int = 3) -> list[torch.nn.Module]:
    """Every torch model `holder` keeps in its attributes (through dicts, lists and tuples), found without asking it:
    a role that left a model out of `device_models()` would keep that model's weights on the device unseen."""
    values = list(vars(holder).values()) if hasattr(holder, "__dict__") else []
    found: list[torch.nn.Module] = []
    while values and depth > 0:
        inner: list[object] = []
        for value in values:
            if isinstance(value, torch.nn.Module):
                found.append(value)
            elif isinstance(value, dict):
                inner.extend(value.values())
            elif isinstance(value, list | tuple):
                inner.extend(value)
        values, depth = inner, depth - 1
    return list({id(model): model for model in found}.values())


def device_bytes(family: ModelSet, role: Role) -> int:
    """Bytes of every storage the role's models' parameters and buffers view (a parked one views 0 bytes)."""
    storages = {
        tensor.untyped_storage().data_ptr(): tensor.untyped_storage().nbytes()
        for model in held_models(family.module(role))
        for tensor in (*model.parameters(), *model.buffers())
        if tensor.untyped_storage().nbytes()
    }
    return sum(storages.values())


def live_bytes() -> int:
    """Bytes of every storage any live tensor or storage object in this process views (a gc walk): what a copy
    kept anywhere, not only in a model, would add to."""
    gc.collect()
    storages: dict[int, int] = {}
    with warnings.catch_warnings():  # isinstance on torch.distributed's deprecated aliases warns
        warnings.simplefilter("ignore", FutureWarning)
        for thing in gc.get_objects():
            # Plain tensors and parameters, and storages. A tensor subclass (the fake and functional tensors an
            # earlier test's torch.compile left, a DTensor) holds no memory of its own: what it wraps is a plain
            # tensor this walk finds too.
            if type(thing) in (torch.Tensor, torch.nn.Parameter) and not thing.is_meta:
                storage = thing.untyped_storage()
            elif isinstance(thing, torch.UntypedStorage) and thing.device.type != "meta":  # a fake tensor's is meta
                storage = thing
            else:
                continue
            try:
                storages[storage.data_ptr()] = storage.nbytes()
            except (RuntimeError, NotImplementedError):  # a storage with no data (a fake tensor's)
                continue
    return sum(storages.values())


def checked(stage: type[Stage], run: Run) -> type[Stage]:
    """`stage`, recording every role's device bytes just before and just after it runs."""

    class Checked(stage):  # type: ignore[misc,valid-type]
        def run(self, session: Session, state: ChunkState) -> None:
            before = {role: device_bytes(session.models, role) for role in Role}
            super().run(session, state)
            after = {role: device_bytes(session.models, role) for role in Role}
            run.seen.append((self.role, before, after))
            if run.residency is Residency.SWITCH:
                run.live.append((self.role, live_bytes()))

    return Checked


def render(
    family: ModelSet, residency: Residency, *, chunks: list[ChunkRequest] = CHUNKS, image: np.ndarray | None = None
) -> Run:
    run = Run(residency=residency)
    output = OutputSpec(fps=25) if image is None else OutputSpec(fps=25, resolution="512", preview=True)
    pipeline = Pipeline(family, tuple(checked(stage, run) for stage in DEFAULT_STAGES), residency=residency)
    session = pipeline.start_session(portrait() if image is None else image, output, audio())
    for chunk in chunks:
        result = pipeline.run_chunk(session, chunk, Sink(run.first_frames if chunk is chunks[0] else None))
        run.hashes.append(result.frame_hashes)
        run.stage_ms.append(result.stage_ms)
    return run


@pytest.fixture(scope="module")
def resident() -> Run:
    return render(tiny(), Residency.RESIDENT)


@pytest.fixture(scope="module")
def switched() -> Run:
    return render(tiny(), Residency.SWITCH)


def test_switch_renders_the_same_frames_as_resident(resident: Run, switched: Run) -> None:
    assert switched.hashes == resident.hashes
    assert [len(hashes) for hashes in resident.hashes] == [8, 8, 4]


def test_every_model_a_role_holds_is_one_it_declares() -> None:
    family = tiny()
    render(family, Residency.SWITCH, chunks=CHUNKS[:1])  # every role loaded its models
    held = {role: held_models(family.module(role)) for role in Role}
    for role, models in held.items():
        assert {id(model) for model in models} == {id(m) for m in family.module(role).device_models()}, role
    assert sum(len(models) for models in held.values()) >= 4  # the encoders, A2V, SR, the decoder


def test_only_the_running_stage_models_hold_device_memory_in_switch_mode(resident: Run, switched: Run) -> None:
    assert [role for role, _, _ in switched.seen] == [stage.role for stage in DEFAULT_STAGES] * len(CHUNKS)
    for role, before, after in switched.seen:
        for other in Role:
            if other is not role:
                assert before[other] == 0 and after[other] == 0, (role, other)
        assert after[role] > 0, role  # its weights came in, block by block, for its forward
    # RESIDENT keeps every model's weights in place throughout.
    assert all(before[role] > 0 for _, before, _ in resident.seen for role in Role)


def test_switch_mode_keeps_no_copy_beyond_one_host_copy_of_each_model(switched: Run) -> None:
    """Live bytes after each stage = the host copies (the same throughout) + the running stage's models + that
    stage's small activations. A copy of a parked model kept anywhere (a clone of a freed storage, a second host
    copy) shows as a gap that changes with the stage, or that grows chunk after chunk."""
    running = {role: after[role] for role, _, after in switched.seen}
    rest = [live - running[role] for role, live in switched.live]
    assert [role for role, _ in switched.live] == [stage.role for stage in DEFAULT_STAGES] * len(CHUNKS)
    smallest = min(running.values())
    assert max(rest) - min(rest) < smallest / 4, (rest, running)


def test_switch_mode_reports_the_visible_switch_time_per_chunk(resident: Run, switched: Run) -> None:
    stage_names = [stage.name for stage in DEFAULT_STAGES]
    for stage_ms in switched.stage_ms:
        assert list(stage_ms) == [*stage_names, SWITCH_KEY]
        assert stage_ms[SWITCH_KEY] > 0  # every chunk saw its models come in (a figure: its size is not checked)
    for stage_ms in resident.stage_ms:
        assert list(stage_ms) == stage_names


def test_a_family_without_torch_models_renders_the_same_in_both_modes() -> None:
    with Image.open(Path(__file__).resolve().parents[3] / "monologue" / "samples" / "portrait.jpg") as opened:
        image = np.asarray(opened.convert("RGB"))
    chunks = CHUNKS[:2]
    resident = render(build_family_by_name(Family.WARP), Residency.RESIDENT, chunks=chunks, image=image)
    switched = render(build_family_by_name(Family.WARP), Residency.SWITCH, chunks=chunks, image=image)
    assert switched.hashes == resident.hashes
    assert all(stage_ms[SWITCH_KEY] == 0 for stage_ms in switched.stage_ms)


def test_bf16_weights_render_finite_frames_close_to_fp32(resident: Run) -> None:
    """Parameters stored in bf16 (the CUDA default) run on CPU too: N0's frames to within a loose band."""
    family = tiny(Precision.BF16)
    run = render(family, Residency.RESIDENT, chunks=CHUNKS[:1])
    for module in family.modules():
        assert {parameter.dtype for model in module.device_models() for parameter in model.parameters()} == {
            torch.bfloat16
        }
    exact, approximate = np.concatenate(resident.first_frames), np.concatenate(run.first_frames)
    assert exact.std() > 10, "flat frames would prove nothing"
    difference = np.abs(exact - approximate)
    assert 0 < difference.mean() < 4 and np.percentile(difference, 99) < 24


def test_auto_precision_is_bf16_on_cuda_and_fp32_on_cpu() -> None:
    assert Precision.AUTO.dtype("cuda") == Precision.AUTO.dtype("cuda:1") == torch.bfloat16
    assert Precision.AUTO.dtype("cpu") == torch.float32
    assert Precision.FP32.dtype("cuda") == torch.float32 and Precision.BF16.dtype("cpu") == torch.bfloat16


@pytest.mark.parametrize(("value", "expected"), [(None, Residency.RESIDENT), ("switch", Residency.SWITCH)])
def test_the_node_builds_its_pipelines_with_the_residency_setting(
    monkeypatch: pytest.MonkeyPatch, value: str | None, expected: Residency
) -> None:
    from activities.pipelines import node_pipeline
    from monologue.settings import get_settings

    monkeypatch.delenv("MONOLOGUE_NODE__RESIDENCY", raising=False)
    if value is not None:
        monkeypatch.setenv("MONOLOGUE_NODE__RESIDENCY", value)
    get_settings.cache_clear()
    try:
        assert node_pipeline("warp").residency is expected
    finally:
        get_settings.cache_clear()
