"""Captions from timed words: cues that break where a reader expects (sentences, full lines, long cues), never
overlap, keep the words as written, and come out as exact WebVTT and SRT; and the option that asks for them."""

from __future__ import annotations

import pytest

from monologue import keys
from monologue.captions import (
    CaptionFormat,
    Cue,
    TimedWord,
    build_cues,
    cues_json,
    display_tokens,
    read_cues,
    render,
    timed_tokens,
    to_srt,
    to_vtt,
)
from monologue.contracts import CaptionMode, RenderOptions, render_options


def _words(text: str, step_s: float = 0.3) -> list[TimedWord]:
    """Each word `step_s` long, spoken back to back with a 0.05 s gap."""
    return [TimedWord(word, n * step_s, n * step_s + step_s - 0.05) for n, word in enumerate(text.split())]


def test_cues_end_after_sentences_and_keep_the_words_as_written() -> None:
    cues = build_cues(_words("Hello, World! It's 42 degrees — isn't it? Yes."))
    assert [cue.text for cue in cues] == ["Hello, World!", "It's 42 degrees — isn't it?", "Yes."]
    assert cues[0].start_s == 0.0 and cues[0].end_s == pytest.approx(0.55) and cues[0].text == "Hello, World!"
    assert (cues[1].start_s, cues[1].end_s) == pytest.approx((0.6, 2.35))


def test_a_long_sentence_fills_two_lines_then_starts_a_new_cue() -> None:
    text = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
    cues = build_cues(_words(text, 0.1), max_chars_per_line=20)
    assert [cue.text for cue in cues] == [
        "one two three four\nfive six seven eight",
        "nine ten eleven\ntwelve thirteen",
        "fourteen fifteen\nsixteen",
    ]
    assert all(len(line) <= 20 for cue in cues for line in cue.text.split("\n"))


def test_a_cue_lasts_at_most_max_cue_s_and_cues_never_overlap() -> None:
    words = _words("a b c d e f g h i j k l m n o p", step_s=1.0)
    cues = build_cues(words, max_cue_s=3.0)
    assert [cue.text for cue in cues] == ["a b c", "d e f", "g h i", "j k l", "m n o", "p"]
    assert all(cue.end_s - cue.start_s <= 3.0 for cue in cues)
    overlapping = [TimedWord("Yes.", 0.0, 1.0), TimedWord("No.", 0.8, 1.5)]  # an aligner's words may touch
    first, second = build_cues(overlapping)
    assert first.end_s == second.start_s == 0.8


def test_webvtt_and_srt_are_exact() -> None:
    cues = (Cue(0.0126, 1.5, "Hello, <world> & you"), Cue(61.25, 3723.4567, "two\nlines"))
    assert to_vtt(cues) == (
        "WEBVTT\n\n"
        "00:00:00.013 --> 00:00:01.500\nHello, &lt;world&gt; &amp; you\n\n"
        "00:01:01.250 --> 01:02:03.457\ntwo\nlines\n"
    )
    assert to_srt(cues) == (
        "1\n00:00:00,013 --> 00:00:01,500\nHello, <world> & you\n\n2\n00:01:01,250 --> 01:02:03,457\ntwo\nlines\n"
    )
    assert to_vtt(()) == "WEBVTT\n" and to_srt(()) == ""
    assert to_srt([Cue(0, 1, "a --> b\n\n")]) == "1\n00:00:00,000 --> 00:00:01,000\na -> b\n"  # no early cue end


def test_stored_cues_read_back_and_every_format_renders() -> None:
    cues = (Cue(0.5, 1.25, "Héllo\nthere"),)
    assert read_cues(cues_json(cues)) == cues
    assert render(cues, CaptionFormat.VTT).decode() == to_vtt(cues)
    assert render(cues, CaptionFormat.SRT).decode() == to_srt(cues)
    assert keys.captions("s1", CaptionFormat.VTT) == "sessions/s1/out/captions.vtt"
    assert keys.PUBLIC_OUTPUT.fullmatch("captions.vtt") and keys.PUBLIC_OUTPUT.fullmatch("captions.srt")
    assert not keys.PUBLIC_OUTPUT.fullmatch("captions.json")  # the node's own


def test_untimed_tokens_join_their_neighbour() -> None:
    tokens = [token for _, token in display_tokens("— Hello  there — 42 friends")]
    assert display_tokens("ab  c")[1] == (4, "c")
    times = [None, (0.0, 0.5), (0.5, 0.9), None, None, (1.0, 1.5)]
    assert timed_tokens(tokens, times) == (
        TimedWord("— Hello", 0.0, 0.5),
        TimedWord("there — 42", 0.5, 0.9),
        TimedWord("friends", 1.0, 1.5),
    )


def test_captions_need_the_words_spoken_and_are_restored_from_stored_options() -> None:
    with pytest.raises(ValueError, match=r"^captions: need the words spoken"):
        RenderOptions(captions=CaptionMode.FILES)
    options = RenderOptions(text="Hi.", captions=CaptionMode.BURN)
    assert render_options({"text": "Hi.", "captions": "burn"}) == options
    assert render_options({}).captions is CaptionMode.NONE  # a session stored before the option
