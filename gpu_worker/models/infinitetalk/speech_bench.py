"""wav2vec2 passes and context-stage time per chunk for one render, its speech encoded per chunk (a live session's
way, and every session's before issue 29 item 6) or once whole (a render's, `InfiniteTalkContext.encode_speech`).

    python -m gpu_worker.models.infinitetalk.speech_bench [--seconds 10] [--chunk-frames 16] [--json-out F]
    python -m gpu_worker.models.infinitetalk.speech_bench --base-pass --seconds 60

Runs only the context stage (`Pipeline(..., stages=(ContextStage,))`) over the tiny preset's random checkpoints
(`make_checkpoint.py`, written to a temporary folder), on the CPU unless CUDA is there. The whole speech's rows are
held in memory here; a node stores them and reads each chunk's by range (`activities/speech_features.py`).
`--base-pass` times one whole-speech pass of a random wav2vec2 at chinese-wav2vec2-base's shape (12 layers of 768)
instead, the part of a session's start that grows with its speech.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import Wav2Vec2Config, Wav2Vec2Model

from gpu_worker.models.infinitetalk import build_family
from gpu_worker.models.infinitetalk.checkpoint import InfiniteTalkWeights, Locations
from gpu_worker.models.infinitetalk.config import TINY
from gpu_worker.models.infinitetalk.encoders import encode_audio
from gpu_worker.models.infinitetalk.make_checkpoint import write
from gpu_worker.pipeline import Pipeline
from gpu_worker.pipeline.stages import ContextStage
from gpu_worker.pipeline.types import ArrayAudio, ChunkRequest, OutputSpec
from monologue.contracts import Family, RenderOptions
from monologue.plan import chunk_sizes, frame_count, plan_chunks


class _NoFrames:
    def write(self, frames: np.ndarray) -> None:
        pass


def _measure(pipeline: Pipeline, audio: ArrayAudio, options: RenderOptions, whole: bool) -> dict[str, float]:
    """One render's context stages: wav2vec2 passes, the whole-speech encoding's ms, the mean context ms per chunk."""
    calls = [0]
    wav2vec = pipeline.models.context.models["wav2vec"]  # type: ignore[attr-defined]
    hook = wav2vec.feature_extractor.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    session = pipeline.start_session(np.zeros((90, 80, 3), np.uint8), OutputSpec(fps=options.fps), audio)
    started = time.perf_counter()
    if whole:
        pipeline.encode_speech(session)
    encode_ms = (time.perf_counter() - started) * 1000
    chunks = plan_chunks(frame_count(len(audio.samples), rate=audio.rate, fps=options.fps), **chunk_sizes(options))
    stage_ms = [
        pipeline.run_chunk(session, ChunkRequest.of(chunk, options), _NoFrames()).stage_ms["context"]
        for chunk in chunks
    ]
    hook.remove()
    return {
        "chunks": len(chunks),
        "wav2vec2_calls": calls[0],
        "encode_speech_ms": round(encode_ms, 1),
        "context_ms_per_chunk": round(sum(stage_ms) / len(stage_ms), 1),
        "total_ms": round(encode_ms + sum(stage_ms), 1),
    }


def _base_pass(seconds: float) -> dict[str, float]:
    """One `encode_audio` pass of a random wav2vec2-base over `seconds` of noise: seconds taken, MiB of rows."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Wav2Vec2Model(Wav2Vec2Config()).eval().requires_grad_(False).to(device)
    samples = torch.randn(1, int(16_000 * seconds), generator=torch.Generator().manual_seed(0)).to(device)
    started = time.perf_counter()
    with torch.inference_mode():
        rows = encode_audio(model, samples, int(25 * seconds)).cpu()
    return {"pass_s": round(time.perf_counter() - started, 2), "rows_mib": round(rows.numel() * 4 / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--chunk-frames", type=int, default=16)
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--base-pass", action="store_true", help="time a real-shape wav2vec2 pass instead")
    args = parser.parse_args()
    if args.base_pass:
        print(json.dumps({"seconds": args.seconds, **_base_pass(args.seconds)}))
        return
    options = RenderOptions(family=Family.INFINITETALK, chunk_frames=args.chunk_frames, i_frames=4, prompt="a studio")
    t = np.arange(int(16_000 * args.seconds)) / 16_000
    audio = ArrayAudio((0.3 * np.sin(2 * np.pi * 220 * t) * (t % 0.5 < 0.3)).astype(np.float32))
    with tempfile.TemporaryDirectory() as folder:
        weights = InfiniteTalkWeights(TINY, Locations.under(write(Path(folder), TINY, seed=3)))
        pipeline = Pipeline(build_family(weights), stages=(ContextStage,))
        _measure(pipeline, ArrayAudio(audio.samples[:16_000]), options, whole=False)  # warm: the prompt's tokens
        results = {mode: _measure(pipeline, audio, options, whole=mode == "whole") for mode in ("per_chunk", "whole")}
    report = {"seconds": args.seconds, "chunk_frames": args.chunk_frames, **results}
    print(json.dumps(report, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
