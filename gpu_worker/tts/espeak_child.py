"""One espeak-ng synthesis in a process of its own: `python -I espeak_child.py VOICE < text`; the standard library
only (run by path, not imported: no package, no NumPy, a fast start).

Writes one JSON line ({"rate": …, "events": [[sample, IPA name], …], "words": [[sample, character], …]}) and then
the samples (int16, native order) to stdout; exit status 2 with the message on stderr for a voice espeak-ng does not
have, 3 without libespeak-ng, 1 for anything else.

Why a process per synthesis: libespeak-ng keeps state from one synthesis to the next that nothing in its API
resets (the same text comes out a few samples shorter every time, even across espeak_Terminate/espeak_Initialize),
so only a fresh process gives the same samples for the same text and voice. It also keeps a crash in the C library
away from the node.

Why the library and not the `espeak-ng` command: only the library reports when each phone starts. Its phoneme
events (espeakEVENT_PHONEME, asked for with espeakINITIALIZE_PHONEME_EVENTS, named in IPA) carry the sample at
which the phone begins in the very audio the same call returns; its word events (espeakEVENT_WORD) the sample at
which each word begins and the word's first character in the text (1-based), which is how captions are timed.
The command's `--pho` timings exist only for MBROLA voices (it prints nothing with espeak-ng's own), and `-x`/`-X`
print phones without times.
"""

import ctypes
import ctypes.util
import json
import sys

# speak_lib.h: AUDIO_OUTPUT_SYNCHRONOUS returns once the text is spoken, handing the audio to the callback.
SYNCHRONOUS = 2
PHONEME_EVENTS, IPA_NAMES, DONT_EXIT = 0x0001, 0x0002, 0x8000
EVENT_END_OF_LIST, EVENT_WORD, EVENT_PHONEME = 0, 1, 7
CHARS_UTF8, POS_CHARACTER = 1, 1
# espeak_PARAMETER: rate (words per minute; espeak-ng's default is 175), volume, pitch, range.
PARAMETERS = {1: 165, 2: 100, 3: 50, 4: 50}
NO_VOICE, NO_LIBRARY = 2, 3


class EventId(ctypes.Union):
    _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8)]


class Event(ctypes.Structure):
    """espeak_EVENT (speak_lib.h)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),  # ms
        ("sample", ctypes.c_int),  # samples from the start of the synthesis
        ("user_data", ctypes.c_void_p),
        ("id", EventId),
    ]


class VoiceSpec(ctypes.Structure):
    """espeak_VOICE (speak_lib.h): a voice chosen by language when no voice has the name."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("languages", ctypes.c_char_p),
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    ]


CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(Event))


def synthesise(text: bytes, voice: bytes) -> tuple[int, list[list[object]], list[list[int]], bytes]:
    """(rate, [[sample, IPA name], …] of each phoneme event, [[sample, character], …] of each word event, int16
    samples)."""
    try:  # find_library reads ldconfig's cache; the soname is the fallback where there is none
        lib = ctypes.CDLL(ctypes.util.find_library("espeak-ng") or "libespeak-ng.so.1")
    except OSError as err:
        print(f"libespeak-ng is not installed on this node (apt-get install libespeak-ng1): {err}", file=sys.stderr)
        sys.exit(NO_LIBRARY)
    lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint]
    lib.espeak_Synth.argtypes += [ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
    lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    lib.espeak_SetVoiceByProperties.argtypes = [ctypes.POINTER(VoiceSpec)]
    rate = lib.espeak_Initialize(SYNCHRONOUS, 0, None, PHONEME_EVENTS | IPA_NAMES | DONT_EXIT)
    if rate <= 0:
        raise OSError(f"espeak-ng did not initialise ({rate}): is espeak-ng-data installed?")
    pcm: list[bytes] = []
    events: list[list[object]] = []
    words: list[list[int]] = []

    def receive(wav: object, count: int, found_events: object) -> int:
        if count > 0:
            pcm.append(ctypes.string_at(wav, 2 * count))
        index = 0
        while found_events[index].type != EVENT_END_OF_LIST:  # type: ignore[index]
            event = found_events[index]  # type: ignore[index]
            if event.type == EVENT_PHONEME:
                events.append([event.sample, event.id.string.decode("utf-8", "replace")])
            elif event.type == EVENT_WORD:
                words.append([event.sample, event.text_position])
            index += 1
        return 0  # go on

    callback = CALLBACK(receive)
    lib.espeak_SetSynthCallback(callback)
    # As the `espeak-ng` command: a voice's name (en-us, en-us+f3), else the best voice for it as a language.
    if lib.espeak_SetVoiceByName(voice) != 0:
        spec = VoiceSpec(languages=voice)
        if lib.espeak_SetVoiceByProperties(ctypes.byref(spec)) != 0:
            print(
                f"voice: espeak-ng has no voice {voice.decode()!r} (`espeak-ng --voices` lists them)", file=sys.stderr
            )
            sys.exit(NO_VOICE)
    for parameter, value in PARAMETERS.items():
        lib.espeak_SetParameter(parameter, value, 0)
    if lib.espeak_Synth(text, len(text) + 1, 0, POS_CHARACTER, 0, CHARS_UTF8, None, None) != 0:
        raise OSError(f"espeak-ng failed to synthesise {len(text)} bytes")
    return rate, events, words, b"".join(pcm)


def main() -> None:
    rate, events, words, pcm = synthesise(sys.stdin.buffer.read(), sys.argv[1].encode())
    sys.stdout.buffer.write(json.dumps({"rate": rate, "events": events, "words": words}).encode() + b"\n")
    sys.stdout.buffer.write(pcm)


if __name__ == "__main__":
    main()
