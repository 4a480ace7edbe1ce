"""Checking what a client sent, on a worker of the shared queue while the API waits (the API has no media stack):
a new session's uploads (`ValidateInputsWorkflow`) and a new avatar's portrait (`PrepareAvatarWorkflow`)."""

# No `from __future__ import annotations`: Temporal's converter resolves these field types at run time (see
# monologue/contracts/__init__.py, which re-exports every name here).
from dataclasses import dataclass

from monologue.contracts.session import CaptionMode, Family, SessionKind

# Checking a new session's uploads: the API has no media stack (no av, Pillow, OpenCV or torch), so it stages
# the raw uploads and a worker on the shared queue decodes, checks and normalises them while the API waits.
VALIDATE_INPUTS = "validate_inputs"
VALIDATE_WORKFLOW = "ValidateInputsWorkflow"


def validate_workflow_id(session_id: str) -> str:
    return f"validate-{session_id}"


@dataclass
class ValidateInputsInput:
    """Decode the staged uploads of a new session (`keys.staged_upload`), check them for `family` and store the
    normalised forms (`keys.portrait`, `keys.audio`) in their place. A live session has a portrait only; a render
    spoken from text has no audio upload: `text` is synthesised in `voice` (`gpu_worker.tts`) and stored as its audio,
    with the phones' timings (`keys.speech_phones`)."""

    session_id: str
    kind: SessionKind
    family: Family  # histories recorded when this was a str decode to the enum (a StrEnum travels as its value)
    max_portrait_side: int
    max_audio_seconds: float
    text: str = ""
    voice: str = ""
    # Captions (`keys.captions`) are written here, once every input passed, from `text`'s synthesis or from the
    # words of `transcript` aligned to the audio.
    captions: CaptionMode = CaptionMode.NONE
    transcript: str = ""
    # The portrait is an avatar's (`PrepareAvatarInput`), checked when it was made and copied to `keys.portrait`
    # already: only the audio is checked here.
    portrait_ready: bool = False


@dataclass
class ValidateInputsResult:
    width: int  # the normalised portrait (0 with `portrait_ready`: the avatar's size is known)
    height: int
    audio_samples: int = 0  # 16 kHz; 0 without audio


# Making an avatar (`POST /v1/avatars`): as for a session's uploads, a worker of the shared queue decodes, checks
# and normalises its portrait while the API waits (PrepareAvatarWorkflow runs this one activity).
PREPARE_AVATAR = "prepare_avatar"
PREPARE_AVATAR_WORKFLOW = "PrepareAvatarWorkflow"


def prepare_avatar_workflow_id(avatar_id: str) -> str:
    return f"avatar-{avatar_id}"


@dataclass
class PrepareAvatarInput:
    """Normalise the portrait staged at `keys.avatar_upload`, check it for every family this deployment renders (a
    face the warp family can animate), store it at `keys.avatar_portrait` and delete the upload."""

    tenant: str
    avatar_id: str
    max_portrait_side: int


@dataclass
class PrepareAvatarResult:
    width: int  # the normalised portrait
    height: int
    portrait_sha256: str
