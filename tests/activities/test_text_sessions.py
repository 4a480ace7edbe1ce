"""A session spoken from text, as a node builds it from storage (`SessionCache`): its visemes follow the stored
phones of the synthesis (no recognition), and a node that never saw the session (a resume, a move) builds the same
session from the same stored speech and phones and renders the same frames."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from activities.pipelines import Pipelines
from activities.session_cache import SessionCache
from gpu_worker.models import build_family
from gpu_worker.models.warp.alignment import AlignedPhones
from gpu_worker.pipeline import ChunkRequest, Pipeline
from gpu_worker.tts import phones_json
from gpu_worker.tts.espeak import ESPEAK_ENGINE
from monologue import contracts as c, keys
from monologue.media import encode_wav, normalise_audio, normalise_portrait
from monologue.plan import plan_chunks
from monologue.storage import LocalStore
from tests.gpu_worker.models.test_warp import _ListSink

TEXT = "Bob and his mama buy five blue boots."
OPTIONS = c.RenderOptions(text=TEXT, lip_sync=c.LipSync.VISEMES, resolution=c.Resolution.SQUARE_512, preview=True)


class _Quiet:
    """The progress a session build reports to, outside an activity (no heartbeats to send)."""

    def __call__(self, stage: str, step: int = 0, steps: int = 0) -> None:
        pass

    def long_step(self, stage: str, *, limit_s: float) -> AbstractContextManager[None]:
        return nullcontext()


def _frames(cache: SessionCache, pipeline: Pipeline) -> list[list[str]]:
    session = cache.get("s", OPTIONS, c.SessionKind.RENDER, progress=_Quiet())  # type: ignore[arg-type]
    assert isinstance(session.prepared, AlignedPhones)
    chunks = plan_chunks(60, n_frames=20, i_frames=4)
    return [
        pipeline.run_chunk(session, ChunkRequest(chunk, lip_sync=c.LipSync.VISEMES), _ListSink()).frame_hashes
        for chunk in chunks
    ]


def test_a_text_session_rebuilt_on_another_node_reads_the_stored_phones_and_renders_the_same_frames(
    tmp_path: Path, sample_portrait: bytes
) -> None:
    store = LocalStore(tmp_path / "objects")
    synthesis = ESPEAK_ENGINE.synthesise(TEXT, "en-us")  # as validate_inputs stores it
    store.put(keys.portrait("s"), normalise_portrait(sample_portrait).png)
    store.put(keys.audio("s"), normalise_audio(encode_wav(synthesis.pcm, synthesis.rate)).wav)
    store.put(keys.speech_phones("s"), phones_json(synthesis.phones or ()))
    first, second = Pipeline(build_family(c.Family.WARP)), Pipeline(build_family(c.Family.WARP))
    made = _frames(SessionCache(store=store, pipelines=Pipelines(lambda _: first)), first)
    again = _frames(SessionCache(store=store, pipelines=Pipelines(lambda _: second)), second)
    assert again == made and len(made) >= 3
    assert first.models.context.recogniser.decoded == 0 == second.models.context.recogniser.decoded  # type: ignore[attr-defined]
