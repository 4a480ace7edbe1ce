"""A new session's captions, made once by `validate_inputs` from the words spoken: espeak-ng's word timings for
speech synthesised from text; otherwise (a transcript, or a Piper voice, which times no words) PocketSphinx's
forced alignment of the words over the speech. Stored under `keys.captions` in every `CaptionFormat`, with the
outputs; the HLS subtitle rendition and the burn-in read them from there."""

from __future__ import annotations

from gpu_worker.models.warp.alignment import TranscriptAligner
from gpu_worker.pipeline import ArrayAudio
from gpu_worker.tts import Synthesis
from monologue import captions, contracts as c, keys
from monologue.captions import CaptionFormat, Cue, TimedWord
from monologue.errors import InputError
from monologue.media import Speech, decode_wav
from monologue.storage import ObjectStore


def caption_cues(
    request: c.ValidateInputsInput, speech: Speech | None, synthesis: Synthesis | None
) -> tuple[Cue, ...] | None:
    """The session's cues, or None when it asks for no captions; InputError naming `transcript` for a transcript
    that does not align with the speech (or `captions` for a synthesis that cannot be aligned to its text)."""
    if request.captions == c.CaptionMode.NONE or speech is None:
        return None
    return captions.build_cues(_words(request, speech, synthesis))


def _words(request: c.ValidateInputsInput, speech: Speech, synthesis: Synthesis | None) -> tuple[TimedWord, ...]:
    if synthesis is not None and synthesis.words is not None:
        return synthesis.words
    audio = ArrayAudio(decode_wav(speech.wav))
    if synthesis is None:
        return TranscriptAligner().align_words(audio, request.transcript)
    try:  # an engine without word timings (Piper): align its speech to the text, as a transcript
        return TranscriptAligner().align_words(audio, request.text)
    except InputError as err:
        raise InputError(
            f"captions: voice={request.voice} does not time its words, so its speech is aligned to the text "
            f"(English words of the pronunciation dictionary only), which failed ({err}); use an espeak voice or "
            "leave captions out"
        ) from None


def store_captions(store: ObjectStore, session_id: str, cues: tuple[Cue, ...]) -> None:
    """The cues in every format, each where `keys.captions` says."""
    for fmt in CaptionFormat:
        store.put(keys.captions(session_id, fmt), captions.render(cues, fmt), content_type=captions.MEDIA_TYPES[fmt])
