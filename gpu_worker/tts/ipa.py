"""IPA phones (what espeak-ng's phoneme events and Piper's phonemes are written in) → the warp family's phone set
(`gpu_worker.models.warp.phonemes.PHONES`, PocketSphinx's en-US ARPAbet), so a synthesised session's visemes
follow the phones the engine actually spoke.

Only the mouth matters here: each IPA sound goes to the ARPAbet phone with the same lip and jaw shape, so a
German "ø" (rounded) goes to OW and a Spanish tap "ɾ" to D. Marks of stress, length and pitch belong to the
phone before, as do espeak-ng's switches of language ("(en)"); a pause (an empty name, a space, punctuation) is
silence.
"""

from __future__ import annotations

import unicodedata

SILENCE = "SIL"
# Marks that modify the phone they follow (stress, length, aspiration, tie bars): no phone of their own.
_MARKS = frozenset("ˈˌːˑʰʲʷˠˤ̃͜͡ʼ˞")
# Whole names first: diphthongs and affricates are one phone (one viseme target) in ARPAbet.
_WHOLE = {
    "aɪ": "AY",
    "aʊ": "AW",
    "ɔɪ": "OY",
    "oɪ": "OY",
    "oʊ": "OW",
    "əʊ": "OW",
    "eɪ": "EY",
    "tʃ": "CH",
    "dʒ": "JH",
    "ts": "S",
    "dz": "Z",
    "pf": "F",
    "ɪə": "IH",
    "eə": "EH",
    "ɛə": "EH",
    "ʊə": "UH",
    "aɪə": "AY",
    "aʊə": "AW",
}
# Then the first sound of the name. Vowels by their lips and jaw; consonants by where the lips and teeth are.
_FIRST = {
    # Closed lips, lip-teeth, rounded lips.
    **dict.fromkeys("pɓ", "P"),
    **dict.fromkeys("bβ", "B"),
    **dict.fromkeys("mɱ", "M"),
    **dict.fromkeys("fɸ", "F"),
    **dict.fromkeys("vʋⱱ", "V"),
    **dict.fromkeys("wʍɥ", "W"),
    # Tongue and teeth.
    **dict.fromkeys("tʈʔ", "T"),
    **dict.fromkeys("dɖɗɾɽ", "D"),
    **dict.fromkeys("kcq", "K"),
    **dict.fromkeys("gɡɟɢɠ", "G"),
    **dict.fromkeys("θ", "TH"),
    **dict.fromkeys("ð", "DH"),
    **dict.fromkeys("sɕʂ", "S"),
    **dict.fromkeys("zʑʐ", "Z"),
    **dict.fromkeys("ʃ", "SH"),
    **dict.fromkeys("ʒ", "ZH"),
    **dict.fromkeys("hɦxχçħʕɣʁʀ", "HH"),
    **dict.fromkeys("nɲɳ", "N"),
    **dict.fromkeys("ŋɴ", "NG"),
    **dict.fromkeys("lɫɬɭʎʟɮ", "L"),
    **dict.fromkeys("rɹɻ", "R"),
    **dict.fromkeys("jʝ", "Y"),
    # Vowels: spread, mid, open, rounded.
    **dict.fromkeys("iɨ", "IY"),
    **dict.fromkeys("ɪᵻ", "IH"),
    **dict.fromkeys("e", "EY"),
    **dict.fromkeys("ɛ", "EH"),
    **dict.fromkeys("æ", "AE"),
    **dict.fromkeys("aɑäɒ", "AA"),
    **dict.fromkeys("ʌəɐɘ", "AH"),
    **dict.fromkeys("ɚɝɜɞ", "ER"),
    **dict.fromkeys("ɔ", "AO"),
    **dict.fromkeys("oøɵœɶɤ", "OW"),
    **dict.fromkeys("ʊ", "UH"),
    **dict.fromkeys("uyʉɯ", "UW"),
}


def _bare(name: str) -> str:
    """The name without marks and combining diacritics (ã → a)."""
    decomposed = unicodedata.normalize("NFD", name)
    return "".join(ch for ch in decomposed if ch not in _MARKS and not unicodedata.combining(ch))


def warp_phone(name: str) -> str | None:
    """The warp phone an IPA phone is spoken like; SILENCE for a pause; None for a mark that belongs to the phone
    before it (stress, length) and for a sound no table lists (the caller keeps the phone before)."""
    if not name.strip() or all(not ch.isalpha() and ch not in _MARKS for ch in name):
        return SILENCE  # espeak-ng's pauses have empty names; Piper's spaces and punctuation
    bare = _bare(name)
    if not bare or bare.startswith("("):  # espeak-ng's switch to another language's phones: "(en)"
        return None
    return _WHOLE.get(bare) or _FIRST.get(bare[0])
