"""`monologue bench avatar`: what a reusable avatar saves a live session's start.

A live session's client-side time to first frame (create request sent → first segment in its playlist, the speech
streamed in real time from the moment the session is made), from a portrait upload against from an avatar's id
(`POST /v1/avatars`, made once before the runs). From an upload the API stages the portrait and waits for a node to
decode it and search it for a face (`validate_inputs`), and the node encodes the reference conditioning at the
session's first chunk; from an avatar no node is asked anything at create, and the node takes the reference the
avatar keeps (encoded by its first session). The runs alternate, so both kinds see the same load. Prints each run
and the p50s (figures for docs/benchmarks.md; nothing here asserts)."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from monologue.client import Client
from monologue.media import normalise_audio

POLL_S = 0.02  # playlist polls: well under a chunk (0.64 s), so the first segment is seen within 20 ms of going out


@dataclass
class AvatarBench:
    """Milliseconds per run: create answered, first segment seen (both from the create request), by kind."""

    create_ms: dict[str, list[float]] = field(default_factory=lambda: {"portrait": [], "avatar": []})
    ttff_ms: dict[str, list[float]] = field(default_factory=lambda: {"portrait": [], "avatar": []})

    def lines(self) -> list[str]:
        out = []
        for kind in ("portrait", "avatar"):
            create, ttff = self.create_ms[kind], self.ttff_ms[kind]
            out.append(
                f"{kind:>8}: create p50 {statistics.median(create):.0f} ms, TTFF p50 {statistics.median(ttff):.0f} ms"
                f" (n={len(ttff)}; TTFF runs {', '.join(f'{value:.0f}' for value in ttff)})"
            )
        gain = statistics.median(self.ttff_ms["portrait"]) - statistics.median(self.ttff_ms["avatar"])
        out.append(f"    gain: TTFF p50 {gain:.0f} ms shorter from an avatar")
        return out


def bench_avatar(api_url: str, api_key: str | None, portrait: Path, speech: Path, *, runs: int) -> AvatarBench:
    """`runs` live sessions of each kind, alternating (one warm-up of each first, not counted: the node's first
    session loads the family and the avatar's first encodes its reference)."""
    pcm = normalise_audio(speech.read_bytes()).wav[44:][: 16_000 * 2 * 3]  # 3 s: a few chunks
    image = portrait.read_bytes()
    report = AvatarBench()
    with Client(api_url, api_key=api_key) as client:
        avatar = client.create_avatar(image)
        try:
            for run in range(runs + 1):
                for kind, given in (("portrait", {"portrait": image}), ("avatar", {"avatar": avatar})):
                    create_ms, ttff_ms = _one(client, api_key, pcm, given)
                    if run:
                        report.create_ms[kind].append(create_ms)
                        report.ttff_ms[kind].append(ttff_ms)
        finally:
            client.delete_avatar(avatar.id)
    return report


def _one(client: Client, api_key: str | None, pcm: bytes, given: dict[str, Any]) -> tuple[float, float]:
    """One live session: (create answered, first segment seen) in ms from the create request; waits for its end."""
    started = time.perf_counter()
    session = client.create_live(**given)
    created = time.perf_counter()
    streamer = threading.Thread(target=client.stream_audio, args=(session, pcm), daemon=True)
    streamer.start()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(headers=headers, timeout=10) as http:
        while "seg-" not in http.get(session.links.stream).text:
            time.sleep(POLL_S)
    first = time.perf_counter()
    streamer.join()
    client.wait(session.id, timeout_s=120)
    return 1000 * (created - started), 1000 * (first - started)
