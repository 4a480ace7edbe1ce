"""The sessions a node keeps between chunks: each one's pipeline state (the reference conditioning and the
anchors), least recently used out first.

A session missing here (the node restarted, or the session moved to this node) is rebuilt from storage: the
portrait, the audio, and the reference conditioning stored the first time it was encoded (it is encoded only
once per session, on whichever node starts it). The anchors come back from checkpoints (`checkpoints.py`).
A session with burned-in captions reads its cues here, once (`keys.captions`, JSON).
A render's speech features, for a family that encodes the whole speech once (infinitetalk's wav2vec2), are stored
the same way by the node that starts it and read back by range (`speech_features.py`).
Reading from storage and aligning a transcript are known long steps (`heartbeat.long_step`); encoding the
reference runs the family's modules and is not: if it hangs, the heartbeats stop.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections import OrderedDict

import numpy as np
from safetensors.numpy import load as load_tensors, save as save_tensors

from activities.fault_injection import Faults
from activities.heartbeat import ALIGN_LIMIT_S, STORAGE_LOAD_LIMIT_S, ChunkHeartbeat
from activities.pipelines import Pipelines
from activities.speech_features import StoredFeatures, features_file
from gpu_worker.models import family_entry
from gpu_worker.pipeline import OutputSpec
from gpu_worker.pipeline.burn_in import CaptionBurner
from gpu_worker.pipeline.pipeline import Pipeline, Session
from gpu_worker.pipeline.types import AudioSource
from gpu_worker.tts import TimedPhone, read_phones
from monologue import contracts as c, keys
from monologue.captions import CaptionFormat, read_cues
from monologue.errors import NotFound
from monologue.live_audio import LiveAudio
from monologue.media import StoredWav, decode_png
from monologue.storage import ObjectStore

CACHED_SESSIONS = 4


class SessionCache:
    def __init__(
        self, *, store: ObjectStore, pipelines: Pipelines, size: int = CACHED_SESSIONS, faults: Faults | None = None
    ) -> None:
        self._store = store
        self._pipelines = pipelines
        self._faults = faults or Faults()
        self._size = size
        self._lock = threading.Lock()  # the dict only: sessions of different families build at once
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def get(
        self, session_id: str, options: c.RenderOptions, kind: c.SessionKind, *, progress: ChunkHeartbeat
    ) -> Session:
        """The session from the cache, or rebuilt from storage (told to `progress`). Call it holding the
        family's pipeline slot: encoding the reference runs the family's modules. A live session reads its audio
        as it arrives; a render's is all stored up front."""
        with self._lock:
            if session_id in self._sessions:
                self._sessions.move_to_end(session_id)
                return self._sessions[session_id]
        session = self._build(session_id, options, kind, progress=progress)
        with self._lock:
            self._sessions[session_id] = session
            while len(self._sessions) > self._size:
                self._sessions.popitem(last=False)
        return session

    def drop(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    def _build(
        self, session_id: str, options: c.RenderOptions, kind: c.SessionKind, *, progress: ChunkHeartbeat
    ) -> Session:
        with progress.long_step("loading the session", limit_s=STORAGE_LOAD_LIMIT_S):
            self._faults.slow_load()
            portrait, audio, reference = self._load(session_id, kind)
            avatar, prepared = (None, None) if reference is not None else self._avatar_reference(session_id, options)
        pipeline = self._pipelines.get(options.family)
        # One call on the accelerator with no steps to report: if it hangs, the heartbeats stop, as they should.
        progress("encoding the reference" if reference is None and prepared is None else "restoring the session")
        session = pipeline.start_session(portrait, OutputSpec.of(options), audio, reference or prepared)
        if options.transcript.strip():  # CPU work, 2.5 s per minute of speech: cannot hang the accelerator
            with progress.long_step("aligning the speech to its transcript", limit_s=ALIGN_LIMIT_S):
                pipeline.prepare_speech(session, options.transcript)
        phones = self._spoken_phones(session_id, options)
        if phones is not None:
            pipeline.use_phones(session, phones)
        if options.captions is c.CaptionMode.BURN:  # stored by validate_inputs before the session's row existed
            cues = read_cues(self._store.get(keys.captions(session_id, CaptionFormat.JSON)))
            session.captions = CaptionBurner(
                cues, fps=options.fps, width=session.frame_width, height=session.frame_height
            )
        if reference is None:
            self._store.put(keys.reference(session_id), save_tensors(session.reference))
        if kind is c.SessionKind.RENDER and pipeline.encodes_speech:
            self._speech(session_id, pipeline, session, progress)
        if avatar is not None and prepared is None:
            self._keep_for_avatar(avatar, options, session)
        return session

    def _speech(self, session_id: str, pipeline: Pipeline, session: Session, progress: ChunkHeartbeat) -> None:
        """A render's speech features: encoded whole and stored by the node that starts the session, read back by
        range there and on any node that resumes it (nothing stored: the family encodes each chunk's audio)."""
        key = keys.speech_features(session_id)
        if not self._store.exists(key):
            progress("encoding the speech")  # on the accelerator, no steps: if it hangs, the heartbeats stop
            rows = pipeline.encode_speech(session)
            if rows is None:
                return
            self._store.put(key, features_file(rows))
        session.speech = StoredFeatures(self._store, key)

    def _avatar_reference(
        self, session_id: str, options: c.RenderOptions
    ) -> tuple[str | None, dict[str, np.ndarray] | None]:
        """For a session made from an avatar: the avatar's prefix, and its reference for this family and output
        shape if a session before encoded it (None, None for a session from an upload)."""
        try:
            avatar = self._store.get(keys.session_avatar(session_id)).decode()
        except NotFound:
            return None, None
        try:
            return avatar, load_tensors(self._store.get(_avatar_reference_key(avatar, options)))
        except NotFound:
            return avatar, None

    def _keep_for_avatar(self, avatar: str, options: c.RenderOptions, session: Session) -> None:
        """Store a reference just encoded for the avatar's next sessions, unless the avatar was deleted meanwhile
        (its portrait gone: nothing may be written under its prefix again)."""
        if self._store.exists(keys.avatar_portrait(avatar)):
            self._store.put(_avatar_reference_key(avatar, options), save_tensors(session.reference))

    def _spoken_phones(self, session_id: str, options: c.RenderOptions) -> tuple[TimedPhone, ...] | None:
        """The phones a session's speech was synthesised from (stored with its audio), if it was spoken from text
        by an engine that times them (a Piper voice without alignments does not: its phones are recognised)."""
        if not options.text.strip():
            return None
        try:
            return read_phones(self._store.get(keys.speech_phones(session_id)))
        except NotFound:
            return None

    def _load(
        self, session_id: str, kind: c.SessionKind
    ) -> tuple[np.ndarray, AudioSource, dict[str, np.ndarray] | None]:
        """The session's portrait, its audio and its stored reference (None before the first encoding)."""
        portrait = decode_png(self._store.get(keys.portrait(session_id)))
        audio: AudioSource
        if kind == c.SessionKind.LIVE:
            audio = LiveAudio(self._store, session_id)
        else:
            audio = StoredWav(self._store, keys.audio(session_id))
        try:
            reference: dict[str, np.ndarray] | None = load_tensors(self._store.get(keys.reference(session_id)))
        except NotFound:
            reference = None
        return portrait, audio, reference


def _avatar_reference_key(avatar: str, options: c.RenderOptions) -> str:
    return keys.avatar_reference(avatar, options.family.value, reference_tag(options))


def reference_tag(options: c.RenderOptions) -> str:
    """What a reference depends on besides the portrait, as 16 hex digits: the output shape and the family's settings
    (its weights and preset), so an avatar keeps one reference per shape and never serves one made for other weights."""
    spec = dataclasses.asdict(OutputSpec.of(options))
    configuration = family_entry(options.family).configuration()
    text = json.dumps({"output": spec, "family": configuration}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
