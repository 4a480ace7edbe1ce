"""The words captions are timed by, on the node: espeak-ng's word events (each word from its first spoken phone to
its last, in the synthesis' own phone timings), and a transcript's forced alignment, checked against an independent
PocketSphinx alignment of the same speech; and a transcript that does not align refused naming `transcript`."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

import numpy as np
import pytest

from activities.captions import caption_cues
from gpu_worker.models.warp.alignment import TranscriptAligner
from gpu_worker.pipeline import ArrayAudio
from gpu_worker.tts import Synthesis
from gpu_worker.tts.espeak import ESPEAK_ENGINE
from gpu_worker.tts.ipa import SILENCE
from monologue import contracts as c
from monologue.captions import TimedWord
from monologue.errors import InputError
from monologue.media import AUDIO_RATE, encode_wav, normalise_audio
from tests.gpu_worker.models.test_warp_visemes import TEXT, Spoken, spoken  # noqa: F401 (a module fixture)

SPOKEN_TEXT = "Hello, world! Café naïve: 42 times — it's OK. Well-known words."


def test_espeak_times_every_word_as_written_by_its_own_phones() -> None:
    """The words are the text's, in order, with their punctuation (a dash joins the word before; "42", spoken as
    two words, is one); each starts where its first phone that is not silence starts and ends where its last ends,
    and no word overlaps the next."""
    synthesis = ESPEAK_ENGINE.synthesise(SPOKEN_TEXT, "en-us")
    words, phones = synthesis.words, synthesis.phones
    assert words is not None and phones is not None
    assert [word.text for word in words] == [
        "Hello,", "world!", "Café", "naïve:", "42", "times —", "it's", "OK.", "Well-known", "words."
    ]  # fmt: skip
    sounding = [phone for phone in phones if phone.phone != SILENCE]
    starts, ends = {phone.start_s for phone in sounding}, {phone.end_s for phone in sounding}
    assert all(word.start_s in starts and word.end_s in ends for word in words)
    assert all(a.end_s <= b.start_s for a, b in itertools.pairwise(words))
    # Every sounding phone lies inside one word: the words cover the speech, nothing spoken is left out.
    assert all(any(w.start_s <= p.start_s and p.end_s <= w.end_s for w in words) for p in sounding)
    assert words[-1].end_s <= synthesis.seconds


def _independent_word_alignment(samples: np.ndarray, text: str) -> list[tuple[float, float]]:
    """The test's ground truth: PocketSphinx's own two-pass alignment, set up here (default model, the test's own
    dither), its word segments in seconds, fillers left out."""
    from pocketsphinx import Decoder

    decoder = Decoder(loglevel="FATAL")
    dither = np.round(np.random.default_rng(0).standard_normal(samples.size) * 16)
    pcm = np.clip(np.round(samples * 32768.0) + dither, -32768, 32767).astype("<i2").tobytes()
    decoder.set_align_text(" ".join(re.sub(r"[^a-z' ]", " ", text.lower()).split()))
    for alignment_pass in ("words", "phones within them"):
        if alignment_pass != "words":
            decoder.set_alignment()
        decoder.start_utt()
        decoder.process_raw(pcm, full_utt=True)
        decoder.end_utt()
    return [
        (word.start / 100, (word.start + word.duration) / 100)
        for word in decoder.get_alignment()
        if not word.name.startswith(("<", "["))
    ]


def _request(transcript: str) -> c.ValidateInputsInput:
    return c.ValidateInputsInput(
        session_id="s",
        kind=c.SessionKind.RENDER,
        family=c.Family.WARP,
        max_portrait_side=4096,
        max_audio_seconds=600,
        captions=c.CaptionMode.FILES,
        transcript=transcript,
    )


def test_a_transcript_s_caption_times_are_its_forced_alignment_s_word_times(spoken: Spoken) -> None:  # noqa: F811
    """The captions' cues, as the node makes them, start at their first word's aligned start and end at their last
    word's aligned end (or where the next cue starts), all within one 10 ms step of the independent alignment."""
    truth = _independent_word_alignment(spoken.samples, TEXT)
    words = TranscriptAligner().align_words(ArrayAudio(spoken.samples), TEXT)
    assert [word.text for word in words] == TEXT.split() and len(truth) == len(words)
    assert np.abs(np.array([(w.start_s, w.end_s) for w in words]) - np.array(truth)).max() <= 0.0101

    speech = normalise_audio(encode_wav(spoken.samples))
    cues = caption_cues(_request(TEXT), speech, None)
    assert cues is not None and " ".join(cue.text.replace("\n", " ") for cue in cues) == TEXT
    first = 0
    for number, cue in enumerate(cues):
        count = len(cue.text.split())
        start, end = truth[first][0], truth[first + count - 1][1]
        if number + 1 < len(cues):
            end = min(end, truth[first + count][0])
        assert cue.start_s == pytest.approx(start, abs=0.0101) and cue.end_s == pytest.approx(end, abs=0.0101)
        first += count
    assert first == len(truth)


def test_untimed_tokens_of_a_transcript_join_their_neighbour(spoken: Spoken) -> None:  # noqa: F811
    words = TranscriptAligner().align_words(ArrayAudio(spoken.samples), "— " + TEXT.replace(". ", ". 1 "))
    assert words[0].text == "— Bob" and words[5].text == "map. 1" and len(words) == len(TEXT.split())
    assert all(isinstance(word, TimedWord) for word in words)


def test_a_transcript_that_does_not_align_is_an_input_error_naming_it(spoken: Spoken) -> None:  # noqa: F811
    speech = normalise_audio(encode_wav(spoken.samples[: spoken.samples.size // 8]))
    with pytest.raises(InputError, match=r"^transcript: "):
        caption_cues(_request(TEXT * 3), speech, None)
    with pytest.raises(InputError, match=r"^transcript: .*not in the pronunciation dictionary"):
        caption_cues(_request("Zxqvbn glorptastic."), speech, None)
    assert caption_cues(_request(""), None, None) is None  # a live session: no speech yet, no captions


def test_speech_whose_engine_times_no_words_is_aligned_to_its_text(spoken: Spoken) -> None:  # noqa: F811
    """A Piper voice gives no word timings: its speech is aligned to the text as a transcript would be; text the
    aligner cannot take (not English) is refused naming `captions`."""
    speech = normalise_audio(encode_wav(spoken.samples))
    untimed = Synthesis(pcm=np.zeros(1, np.int16), rate=AUDIO_RATE, phones=None, words=None)
    request = replace(_request(""), text=TEXT, voice="piper")
    cues = caption_cues(request, speech, untimed)
    assert cues is not None and cues == caption_cues(_request(TEXT), speech, None)
    with pytest.raises(InputError, match=r"^captions: voice=piper does not time its words.*pronunciation dictionary"):
        caption_cues(replace(request, text="Über größere Brücken fährt"), speech, untimed)
