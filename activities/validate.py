"""`validate_inputs`, on the shared queue: decode a new session's staged uploads, check them for the model
family and store their normalised forms. The API waits for it (through ValidateInputsWorkflow) before it
writes the session's row, so bad input is still a 4xx that starts nothing; it runs here, on a worker, because
the API process has no media stack.

Staged uploads are deleted once read: the raw files may carry metadata (a photo's location) that the
normalised forms drop. A render spoken from text has no audio upload: its text is synthesised here
(`gpu_worker.tts`), once, and stored where an upload's normalised audio goes, so every later step (a resume, a
session rebuilt on another node) reads the same speech."""

from __future__ import annotations

import functools

from temporalio import activity

from activities.captions import caption_cues, store_captions
from activities.errors import activity_context
from gpu_worker.models import build_family
from gpu_worker.models.dit.checkpoint import CheckpointError
from gpu_worker.pipeline import ModelSet
from gpu_worker.tts import Synthesis, TtsConfig, phones_json
from gpu_worker.tts.engines import engine_for
from monologue import contracts as c, keys
from monologue.errors import InputError
from monologue.media import Portrait, Speech, decode_png, encode_wav, normalise_audio, normalise_portrait
from monologue.storage import ObjectStore


class ValidateActivities:
    def __init__(self, *, store: ObjectStore, tts: TtsConfig | None = None) -> None:
        self._store = store
        self._tts = tts or TtsConfig()

    @activity.defn(name=c.VALIDATE_INPUTS)
    def validate_inputs(self, request: c.ValidateInputsInput) -> c.ValidateInputsResult:
        """Normalise and check the staged portrait (and audio); an InputError (non-retryable) names the problem."""
        session_id = request.session_id
        with activity_context(session_id=session_id) as log:
            portrait = None if request.portrait_ready else self._portrait(request)  # an avatar's: checked once
            speech, synthesis = None, None
            if request.kind == c.SessionKind.RENDER and request.text.strip():
                speech, synthesis = self._speak(request)
            elif request.kind == c.SessionKind.RENDER:  # a live session's audio comes later, over its socket
                staged = self._store.get(keys.staged_upload(session_id, "audio"))
                speech = normalise_audio(staged, max_seconds=request.max_audio_seconds)
            cues = caption_cues(request, speech, synthesis)  # the last check: a transcript that does not align
            phones = synthesis.phones if synthesis is not None else None
            if speech is not None:
                self._store.put(keys.audio(session_id), speech.wav, content_type="audio/wav")
            if phones is not None:
                self._store.put(keys.speech_phones(session_id), phones_json(phones), content_type="application/json")
            if cues is not None:
                store_captions(self._store, session_id, cues)
            self._store.delete_prefix(keys.staged_uploads(session_id))
            samples = speech.samples if speech is not None else 0
            width, height = (portrait.width, portrait.height) if portrait is not None else (0, 0)
            log.info("inputs valid", width=width, height=height, audio_samples=samples, text=bool(phones))
            return c.ValidateInputsResult(width=width, height=height, audio_samples=samples)

    def _portrait(self, request: c.ValidateInputsInput) -> Portrait:
        """The staged portrait normalised, checked for the family (e.g. no face: NoFaceFound) and stored."""
        staged = self._store.get(keys.staged_upload(request.session_id, "portrait"))
        portrait = normalise_portrait(staged, max_side=request.max_portrait_side)
        _models(request.family).reference.check(decode_png(portrait.png))
        self._store.put(keys.portrait(request.session_id), portrait.png, content_type="image/png")
        return portrait

    def _speak(self, request: c.ValidateInputsInput) -> tuple[Speech, Synthesis]:
        """The text spoken in its voice, normalised as an upload is (16 kHz mono), and the synthesis (its phones'
        and words' timings)."""
        engine, name = engine_for(request.voice, self._tts)
        synthesis = engine.synthesise(request.text, name)
        if synthesis.seconds > request.max_audio_seconds:
            raise InputError(
                f"text: spoken in {request.voice} it lasts {synthesis.seconds:.1f} s, longer than the "
                f"{request.max_audio_seconds:g} s limit (setting MONOLOGUE_LIMITS__MAX_AUDIO_SECONDS); shorten it"
            )
        return normalise_audio(encode_wav(synthesis.pcm, synthesis.rate)), synthesis


@functools.cache
def _models(family: c.Family) -> ModelSet:
    """One family per process: building it constructs its modules (no weights), too slow for every upload. A family
    this node has no weights for (infinitetalk unconfigured) is the request's problem to hear about: a 422."""
    try:
        return build_family(family)
    except CheckpointError as exc:
        raise InputError(f"this deployment cannot render family={family}: {exc}") from exc
