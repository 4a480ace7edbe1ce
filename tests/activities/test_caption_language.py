"""The subtitle rendition's LANGUAGE: the voice's language for speech synthesised from text, else English."""

from __future__ import annotations

import pytest

from activities.playlist import caption_language
from monologue.contracts import CaptionMode, LipSync, RenderOptions


@pytest.mark.parametrize(
    ("voice", "language"),
    [
        ("espeak:en-us", "en-US"),
        ("espeak:de", "de"),
        ("espeak:fr-fr+f3", "fr-FR"),
        ("espeak:cmn", "cmn"),
        ("piper:de_DE-thorsten-medium", "de-DE"),
        ("piper", "en"),
        ("espeak:x1", "en"),  # not a language tag: the default
    ],
)
def test_the_language_follows_the_voice_of_spoken_text(voice: str, language: str) -> None:
    options = RenderOptions(text="Hello.", voice=voice, captions=CaptionMode.FILES)
    assert caption_language(options) == language


def test_captions_of_a_transcript_are_english() -> None:
    options = RenderOptions(transcript="Hello.", lip_sync=LipSync.VISEMES, captions=CaptionMode.FILES)
    assert caption_language(options) == "en"
