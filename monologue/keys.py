"""Object keys, derived only from ids (never from user-supplied names). One place, so the storage
layout in docs/architecture.md stays true."""

from __future__ import annotations

import re
import secrets

from monologue.captions import CaptionFormat
from monologue.contracts.retention import DataPart

# What the API may serve from a session's out/ folder (everything else there is internal). Use `fullmatch`:
# `match` with `$` also accepts a name followed by a newline.
PUBLIC_OUTPUT = re.compile(r"init\.mp4|stream\.m3u8|seg-[NI]\d{5}\.m4s|captions\.(vtt|srt)|main\.m3u8|subs\.m3u8")


def session_prefix(session_id: str) -> str:
    return f"sessions/{session_id}/"


def part_prefixes(session_id: str, part: DataPart) -> tuple[str, ...]:
    """Where one part of a session's data lives (retention removes each on its own clock). Inputs: the uploads as
    received, their normalised forms and live audio (`input/`), and what is derived from the portrait and the speech
    only to resume a session: the reference conditioning and the checkpoints. Outputs: the stream, the videos, the
    frame hashes (`out/`). Together they are everything under `session_prefix`."""
    base = session_prefix(session_id)
    if part is DataPart.INPUTS:
        return (f"{base}upload/", f"{base}input/", f"{base}ref/", f"{base}ckpt/")
    return (f"{base}out/",)


def portrait(session_id: str) -> str:
    return f"sessions/{session_id}/input/portrait.png"


def audio(session_id: str) -> str:
    return f"sessions/{session_id}/input/audio.wav"


def speech_phones(session_id: str) -> str:
    """The phones of speech synthesised from text, with their times (JSON, `gpu_worker.tts.phones_json`): what the
    warp family's visemes follow instead of recognising the audio."""
    return f"sessions/{session_id}/input/phones.json"


def staged_uploads(session_id: str) -> str:
    """The prefix of a session's raw uploads as the API received them, until `validate_inputs` replaces them
    with their normalised forms."""
    return f"sessions/{session_id}/upload/"


def staged_upload(session_id: str, field: str) -> str:
    """One raw upload: `portrait` or `audio`."""
    return staged_uploads(session_id) + field


def reference(session_id: str) -> str:
    """The static reference conditioning, encoded once per session (safetensors)."""
    return f"sessions/{session_id}/ref/conditioning.safetensors"


def speech_features(session_id: str) -> str:
    """A render's speech features, encoded over its whole speech once per session (safetensors, one row per video
    frame, read back by row range: `activities.speech_features`)."""
    return f"sessions/{session_id}/ref/speech.safetensors"


def checkpoint(session_id: str, index: int, lease: int = 0) -> str:
    """The checkpoint after N chunk `index`: its head and tail anchors, with the cursor as metadata. Each node lease
    writes its own (so a node cut off and back never overwrites the file the session's row points to); lease 0 is
    the unfenced name of sessions from before."""
    tag = f".l{lease}" if lease else ""
    return f"sessions/{session_id}/ckpt/{index:05d}{tag}.safetensors"


def segment_name(kind: str, index: int) -> str:
    return f"seg-{kind}{index:05d}.m4s"


def output(session_id: str, name: str) -> str:
    return f"sessions/{session_id}/out/{name}"


def init_segment(session_id: str) -> str:
    return output(session_id, "init.mp4")


def segment(session_id: str, kind: str, index: int) -> str:
    """One chunk's fMP4 fragment (moof + mdat); plays after init.mp4."""
    return output(session_id, segment_name(kind, index))


def playlist(session_id: str) -> str:
    return output(session_id, "stream.m3u8")


def main_playlist(session_id: str) -> str:
    """The multivariant playlist of a session with captions: `stream.m3u8` with the subtitle rendition beside it."""
    return output(session_id, "main.m3u8")


def subtitle_playlist(session_id: str) -> str:
    """The subtitle rendition's media playlist: one WebVTT segment, `captions.vtt`."""
    return output(session_id, "subs.m3u8")


def frame_hashes(session_id: str, kind: str, index: int) -> str:
    return f"sessions/{session_id}/out/hashes/{kind}{index:05d}.json"


def frames_manifest(session_id: str) -> str:
    return output(session_id, "frames.jsonl")


def final_video(session_id: str) -> str:
    return output(session_id, "final.mp4")


def progressive_video(session_id: str) -> str:
    """The final MP4 remuxed with its index first (made from final.mp4 at its first request, then kept)."""
    return output(session_id, "progressive.mp4")


def captions(session_id: str, fmt: CaptionFormat) -> str:
    """The session's captions in one format (`monologue.captions`): written by `validate_inputs` from the words
    spoken, so they go with the outputs."""
    return output(session_id, CaptionFormat(fmt).file_name)


def live_audio_piece(session_id: str, number: int) -> str:
    """Piece `number` of a live session's audio: LIVE_PIECE_SAMPLES samples of 16 kHz s16le mono (the last
    piece of an ended session may be shorter)."""
    return f"sessions/{session_id}/input/live/{number:08d}.pcm"


def live_audio_end(session_id: str) -> str:
    """Written once when a live session's audio ends: its total sample count."""
    return f"sessions/{session_id}/input/live/end.json"


def live_audio_cuts(session_id: str) -> str:
    """The folder of a live session's interruptions (`monologue.live_audio`): one object per `interrupt`."""
    return f"sessions/{session_id}/input/live/cuts/"


def live_audio_cut(session_id: str, start: int) -> str:
    """An interruption of a live session's audio from sample `start`: the stored samples it drops (JSON)."""
    return f"{live_audio_cuts(session_id)}{start:012d}.json"


ASSETS = "assets/"  # every tenant's uploaded assets, under assets/<tenant>/<asset id>/
ASSET_TIME_HEX = 12  # an asset id's first 12 hex digits: its upload time in Unix milliseconds (48 bits)


def new_asset_id(now_s: float) -> str:
    """32 hex digits: the upload time (so retention can age assets without a database row) and 80 random bits."""
    return f"{int(now_s * 1000):0{ASSET_TIME_HEX}x}{secrets.token_hex(10)}"


def asset_uploaded_s(asset_id: str) -> float:
    """The upload time (Unix seconds) that `new_asset_id` put in the id."""
    return int(asset_id[:ASSET_TIME_HEX], 16) / 1000


def asset_prefix(tenant: str, asset_id: str) -> str:
    """A tenant's uploaded asset (`POST /v1/assets`): under the tenant, so another tenant's id finds nothing."""
    return f"assets/{tenant}/{asset_id}/"


def asset(tenant: str, asset_id: str, kind: str) -> str:
    """The asset's bytes, as uploaded; the last part says its kind (portrait or audio)."""
    return f"{asset_prefix(tenant, asset_id)}{kind}"


AVATARS = "avatars/"  # every tenant's avatars, under avatars/<tenant>/<avatar id>/


def avatar_prefix(tenant: str, avatar_id: str) -> str:
    """A tenant's avatar (`POST /v1/avatars`): its portrait checked once and what sessions derive from it."""
    return f"{AVATARS}{tenant}/{avatar_id}/"


def avatar_upload(tenant: str, avatar_id: str) -> str:
    """The portrait as uploaded, until `prepare_avatar` replaces it with its normalised form."""
    return f"{avatar_prefix(tenant, avatar_id)}upload/portrait"


def avatar_portrait(avatar: str) -> str:
    """The avatar's normalised portrait (PNG), copied into each session made from it. `avatar`: its prefix."""
    return f"{avatar}portrait.png"


def avatar_reference(avatar: str, family: str, output: str) -> str:
    """The reference conditioning of the avatar's portrait for one family and output shape (`output`: a digest of
    the session's OutputSpec), encoded by the first session that needs it and copied by the next ones."""
    return f"{avatar}ref/{family}-{output}.safetensors"


def session_avatar(session_id: str) -> str:
    """The prefix of the avatar a session was made from (text), where its node looks for a stored reference."""
    return f"sessions/{session_id}/input/avatar"
