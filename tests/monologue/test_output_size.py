"""Any output size: `width` and `height` beside the named resolutions. Both or neither, even, within the bounds,
never beside a resolution, and for infinitetalk one of its size buckets (the refusal names the nearest); a size
sent over a server whose default is a resolution replaces it instead of conflicting with it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from monologue import contracts as c, options as options_
from monologue.contracts.frames import MAX_SIDE, MIN_SIDE


def _merge(sent: dict[str, object], **defaults: object) -> c.RenderOptions:
    options: c.RenderOptions = options_.merge(options_.defaults_model()(**defaults), sent)
    return options


@pytest.mark.parametrize(
    ("sent", "problem"),
    [
        ({"width": 481, "height": 640}, r"width\n.*multiple of 2"),
        ({"width": 480, "height": MAX_SIDE + 2}, r"height\n.*less than or equal to 2048"),
        ({"width": MIN_SIDE - 2, "height": 640}, r"width\n.*greater than or equal to 32"),
        ({"width": 480}, r"give both or neither \(got only width=480\)"),
        ({"height": 640}, r"give both or neither \(got only height=640\)"),
        ({"width": 480, "height": 640, "resolution": "720p"}, r"not both \(got resolution=720p, width=480, height=640"),
        (
            {"width": 480, "height": 640, "family": "infinitetalk"},
            r"the infinitetalk family renders only its own sizes, and 480x640 is not one; the nearest in shape: "
            r"832x1088, 576x704, 512x768",
        ),
    ],
)
def test_a_bad_size_is_refused_naming_the_fields(sent: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        _merge(sent)


def test_the_dataclass_itself_refuses_what_the_schema_would() -> None:
    """Options built in code (a worker, a test) get the same rules as a request."""
    with pytest.raises(ValueError, match=r"even numbers from 32 to 2048 \(got width=481\)"):
        c.RenderOptions(width=481, height=640)
    with pytest.raises(ValueError, match=r"even numbers from 32 to 2048 \(got width=4000, height=10\)"):
        c.RenderOptions(width=4000, height=10)


def test_warp_and_dit_take_any_even_size_and_infinitetalk_its_buckets_of_either_class() -> None:
    for sent in (
        {"width": 482, "height": 642},
        {"width": 34, "height": 2048, "family": "dit"},
        {"width": 1280, "height": 704, "family": "infinitetalk"},  # a 720-class bucket
        {"width": 448, "height": 832, "family": "infinitetalk"},  # a 480-class one
    ):
        options = _merge(sent)
        assert (options.width, options.height, options.family) == (
            sent["width"],
            sent["height"],
            sent.get("family", "warp"),
        )


def test_a_size_sent_replaces_the_server_s_default_size_whole() -> None:
    """The output size is one choice: a default of 720p does not conflict with a width and height a client
    sends, nor a default width and height with a resolution sent."""
    options = _merge({"width": 480, "height": 640}, resolution="720p")
    assert (options.resolution, options.width, options.height) == (c.Resolution.SOURCE, 480, 640)
    options = _merge({"resolution": "1080p"}, width=480, height=640)
    assert (options.resolution, options.width, options.height) == (c.Resolution.HD_1080, None, None)
    options = _merge({"fps": 30}, resolution="720p")  # nothing of the size sent: the default size stays
    assert (options.resolution, options.width) == (c.Resolution.HD_720, None)


def test_a_size_is_stored_and_read_back_and_rows_from_before_it_have_none() -> None:
    options = c.RenderOptions(width=480, height=640, preview=True)
    assert c.render_options(options_.stored(options)) == options
    assert (c.render_options({"fps": 25, "resolution": "720p"}).width, c.RenderOptions().height) == (None, None)
