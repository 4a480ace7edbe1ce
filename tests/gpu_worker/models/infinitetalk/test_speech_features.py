"""A render's speech is encoded by wav2vec2 once, whole, as the original encodes its utterance (issue 29 item 6):
every frame hears the same features whatever chunk it falls in, the node that starts the session encodes them once
and stores them, and a node that resumes the session reads them from storage and renders the same frames."""

from __future__ import annotations

import io
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("diffusers", reason="the infinitetalk family's models are diffusers' and transformers' classes")

import torch
from PIL import Image

from activities.pipelines import Pipelines
from activities.session_cache import SessionCache
from activities.speech_features import StoredFeatures
from gpu_worker.models.infinitetalk import build_family
from gpu_worker.models.infinitetalk.checkpoint import InfiniteTalkWeights, Locations
from gpu_worker.models.infinitetalk.config import TINY
from gpu_worker.pipeline import Pipeline
from gpu_worker.pipeline.pipeline import Session
from gpu_worker.pipeline.stages import ChunkState, ContextStage
from gpu_worker.pipeline.types import ArrayAudio, ChunkRequest, OutputSpec, chunk_rng
from monologue import contracts as c, keys
from monologue.media import encode_wav
from monologue.plan import chunk_sizes, frame_count, plan_chunks
from monologue.storage import LocalStore

OPTIONS = c.RenderOptions(family=c.Family.INFINITETALK, chunk_frames=16, i_frames=4, prompt="a calm studio")
# Another plan of the same render: a short first chunk, shorter N chunks, wider seams.
OTHER_PLAN = c.RenderOptions(
    family=c.Family.INFINITETALK, chunk_frames=8, i_frames=8, first_chunk_frames=5, prompt="a calm studio"
)


class _Quiet:
    """The progress a session build reports to, outside an activity (no heartbeats to send)."""

    def __call__(self, stage: str, step: int = 0, steps: int = 0) -> None:
        pass

    def long_step(self, stage: str, *, limit_s: float) -> AbstractContextManager[None]:
        return nullcontext()


class _Frames:
    def write(self, frames: np.ndarray) -> None:
        pass


class _Wav2vecCalls:
    """Counts the wav2vec2 encodings a pipeline runs (its convolutional feature extractor's forwards)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.count = 0
        wav2vec = pipeline.models.context.models["wav2vec"]  # type: ignore[attr-defined]
        wav2vec.feature_extractor.register_forward_pre_hook(self._seen)

    def _seen(self, *_: object) -> None:
        self.count += 1


def _pipeline(root: Path) -> Pipeline:
    return Pipeline(build_family(InfiniteTalkWeights(TINY, Locations.under(root))))


def _speech(seconds: float) -> np.ndarray:
    t = np.arange(int(16_000 * seconds)) / 16_000
    return (0.3 * np.sin(2 * np.pi * 220 * t) * (t % 0.5 < 0.3) + 0.05 * np.sin(2 * np.pi * 3 * t)).astype(np.float32)


def _frame_features(session: Session, options: c.RenderOptions, frames: int) -> dict[int, torch.Tensor]:
    """Each frame's audio window (window, layers, dim) as the context stage gives it to the DiT, in `options`' plan."""
    found: dict[int, torch.Tensor] = {}
    for chunk in plan_chunks(frames, **chunk_sizes(options)):
        state = ChunkState(ChunkRequest(chunk, prompt=options.prompt), chunk_rng(3, chunk.kind, 0), _Frames())
        ContextStage().run(session, state)
        windows = state.context["audio"]  # type: ignore[index]  # (own frames, window, layers, dim)
        for offset in range(chunk.n_frames):
            found[chunk.first_frame + offset] = windows[offset]
    return found


def test_every_frame_hears_the_same_features_whatever_the_chunk_plan(tiny_weights: Path) -> None:
    audio = ArrayAudio(_speech(2.0))
    frames = frame_count(len(audio.samples), rate=16_000, fps=25)
    pipeline = _pipeline(tiny_weights)
    session = pipeline.start_session(np.zeros((90, 80, 3), np.uint8), OutputSpec(fps=25), audio)
    pipeline.encode_speech(session)
    one, other = _frame_features(session, OPTIONS, frames), _frame_features(session, OTHER_PLAN, frames)
    assert sorted(one) == sorted(other) == list(range(frames))
    differing = [frame for frame in range(frames) if not torch.equal(one[frame], other[frame])]
    assert differing == [] and one[0].abs().sum() > 0


def _store_render(root: Path, seconds: float) -> LocalStore:
    """A render's inputs as `validate_inputs` leaves them."""
    store = LocalStore(root)
    portrait = (np.random.default_rng(7).random((90, 80, 3)) * 255).astype(np.uint8)
    png = io.BytesIO()
    Image.fromarray(portrait, "RGB").save(png, format="PNG")
    store.put(keys.portrait("s"), png.getvalue())
    store.put(keys.audio("s"), encode_wav(_speech(seconds)))
    return store


def _render(cache: SessionCache, pipeline: Pipeline, chunks: list[c.Chunk]) -> dict[str, list[str]]:
    session = cache.get("s", OPTIONS, c.SessionKind.RENDER, progress=_Quiet())  # type: ignore[arg-type]
    request = (ChunkRequest(chunk, seed=3, prompt=OPTIONS.prompt) for chunk in chunks)
    return {chunk.chunk.name: pipeline.run_chunk(session, chunk, _Frames()).frame_hashes for chunk in request}


def test_a_render_encodes_its_speech_once_and_a_resumed_one_reads_it_from_storage(
    tiny_weights: Path, tmp_path: Path
) -> None:
    store = _store_render(tmp_path / "objects", 1.04)
    chunks = plan_chunks(26, **chunk_sizes(OPTIONS))[:2]  # N0 (17 frames), N1 (5); I0 reads as they do
    first = _pipeline(tiny_weights)
    calls = _Wav2vecCalls(first)
    cache = SessionCache(store=store, pipelines=Pipelines(lambda _: first))
    made = _render(cache, first, chunks[:1])
    checkpoint = cache.get("s", OPTIONS, c.SessionKind.RENDER, progress=_Quiet()).anchors.export()  # type: ignore[arg-type]
    made |= _render(cache, first, chunks[1:])
    assert calls.count == 1 and len(made) == 2  # the whole speech once, not once per chunk
    stored = StoredFeatures(store, keys.speech_features("s"))
    assert stored.frames == 26 and stored.read(-2, 1).shape[0] == 3

    second = _pipeline(tiny_weights)  # another node: the session from storage, the anchors from N0's checkpoint
    calls = _Wav2vecCalls(second)
    cache = SessionCache(store=store, pipelines=Pipelines(lambda _: second))
    cache.get("s", OPTIONS, c.SessionKind.RENDER, progress=_Quiet()).anchors.restore(checkpoint)  # type: ignore[arg-type]
    again = _render(cache, second, chunks[1:])
    assert calls.count == 0
    assert again == {name: made[name] for name in again}
