"""Frame hashes of renders through the whole stack (API, workflow, node) for every family, as JSON: run it on two
trees (before and after a refactor) and compare the files; no behaviour change means identical output.

    PYTHONPATH=. python infra/frame_hashes.py OUT.json

It starts the embedded stack in a temporary folder with tiny random InfiniteTalk weights, renders the bundled
sample with fixed seeds (warp with visemes and with loudness, dit, infinitetalk) and writes each chunk's
`frames_sha256` (the hash of its frames' hashes) from the database. Minutes on a CPU."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from sqlalchemy import create_engine, select

from cli.stack import Stack, free_port
from gpu_worker.models import FAMILIES
from gpu_worker.models.infinitetalk.config import TINY
from gpu_worker.models.infinitetalk.make_checkpoint import write
from monologue import SAMPLES
from monologue.client import Client
from monologue.contracts import Family
from monologue.db import ChunkRow
from monologue.settings import ApiSettings, NodeSettings, Settings, TemporalSettings

RENDERS = [
    {"family": "warp", "seed": 3},
    {"family": "warp", "seed": 3, "lip_sync": "loudness", "resolution": "512"},
    {"family": "dit", "seed": 5, "chunk_frames": 16, "i_frames": 4},
    {"family": "infinitetalk", "seed": 9, "chunk_frames": 16, "i_frames": 4},
]


def main(out: Path) -> None:
    home = Path(tempfile.mkdtemp(prefix="monologue-frame-hashes-"))
    settings = Settings(
        home=home / "stack",
        log_format="json",
        temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
        api=ApiSettings(port=free_port()),
        node=NodeSettings(id="hash-node", http_port=free_port()),
    )
    infinitetalk = FAMILIES[Family.INFINITETALK]
    weights = write(home / "infinitetalk-weights", TINY, seed=11)
    stack = Stack(settings, env={infinitetalk.env("weights"): str(weights), infinitetalk.env("preset"): "tiny"})
    stack.start()
    results = {}
    try:
        with Client(str(settings.api.public_url), api_key=stack.api_key) as client:
            for options in RENDERS:
                session = client.create_render(
                    portrait=SAMPLES / "portrait.jpg", audio=SAMPLES / "speech.wav", options=options
                )
                done = client.wait(session.id, timeout_s=900)
                results[json.dumps(options, sort_keys=True)] = {
                    "status": str(done.status),
                    "chunks": _chunks(settings, session.id),
                }
                print(options, done.status, flush=True)
    finally:
        stack.stop()
    out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def _chunks(settings: Settings, session_id: str) -> list[str]:
    engine = create_engine(settings.db_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                select(ChunkRow.kind, ChunkRow.index, ChunkRow.frames_sha256).where(ChunkRow.session_id == session_id)
            ).all()
    finally:
        engine.dispose()
    return sorted(f"{kind}{index}:{digest}" for kind, index, digest in rows)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
