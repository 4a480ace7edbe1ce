"""Object keys, derived only from ids (never from user-supplied names). One place, so the storage
layout in docs/architecture.md stays true."""

from __future__ import annotations


def session_prefix(session_id: str) -> str:
    return f"sessions/{session_id}/"


def portrait(session_id: str) -> str:
    return f"sessions/{session_id}/input/portrait.png"


def audio(session_id: str) -> str:
    return f"sessions/{session_id}/input/audio.wav"


def face(session_id: str) -> str:
    return f"sessions/{session_id}/ref/face.json"


def segment(session_id: str, kind: str, index: int) -> str:
    return f"sessions/{session_id}/out/seg-{kind}{index:05d}.mp4"


def frame_hashes(session_id: str, kind: str, index: int) -> str:
    return f"sessions/{session_id}/out/hashes/{kind}{index:05d}.json"


def frames_manifest(session_id: str) -> str:
    return f"sessions/{session_id}/out/frames.jsonl"


def final_video(session_id: str) -> str:
    return f"sessions/{session_id}/out/final.mp4"
