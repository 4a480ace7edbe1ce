"""A session's options are defined once, in `contracts.RenderOptions`: the HTTP schema and form, the settings'
per-render defaults and the CLI are derived from it, so an option added to (a copy of) the dataclass appears in
all of them with its type, default and limits, and the enums show their allowed values in OpenAPI."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Annotated, Any

import click
import pytest
from pydantic import ValidationError

from api.app import create_app
from api.inputs import option_form
from cli.options import model_options
from monologue import contracts as c, options as options_
from monologue.settings import Settings


@dataclasses.dataclass(frozen=True)
class WithExtra(c.RenderOptions):
    """A test-only copy of the options with one more."""

    mouth_scale: Annotated[float, c.Bounds("Test-only: how wide the mouth opens.", ge=0.5, le=2.0)] = 1.0


def test_an_option_added_to_the_dataclass_reaches_the_schema_the_form_the_defaults_and_the_cli() -> None:
    request = options_.request_model(WithExtra)
    schema = request.model_json_schema()["properties"]["mouth_scale"]
    assert (schema["minimum"], schema["maximum"], schema["default"]) == (0.5, 2.0, 1.0)
    # New sessions' lip sync is not the dataclass default (which is what inputs from before the option mean).
    new_session = dataclasses.replace(WithExtra(), lip_sync=c.LipSync.VISEMES)
    assert request.model_validate({"mouth_scale": 1.5}).to_options() == dataclasses.replace(
        new_session, mouth_scale=1.5
    )
    with pytest.raises(ValidationError, match="mouth_scale"):
        request.model_validate({"mouth_scale": 3})

    form = inspect.signature(option_form(WithExtra)).parameters
    assert set(form) == {spec.name for spec in dataclasses.fields(WithExtra)}
    assert option_form(WithExtra)(mouth_scale=0.7, fps=None) == {"mouth_scale": 0.7}
    partial = options_.partial_model(WithExtra)  # a JSON create body's fields
    assert options_.given(partial.model_validate({"mouth_scale": 0.7})) == {"mouth_scale": 0.7}
    with pytest.raises(ValidationError, match="mouth_scale"):
        partial.model_validate({"mouth_scale": 3})

    defaults = options_.defaults_model(WithExtra)()
    assert defaults.mouth_scale == 1.0  # type: ignore[attr-defined]
    assert options_.merge(defaults, {"mouth_scale": 0.6}, WithExtra) == dataclasses.replace(
        new_session, mouth_scale=0.6
    )

    @click.command()
    @model_options(request)
    def command(**_: Any) -> None: ...

    assert "--mouth-scale" in {opt for param in command.params for opt in param.opts}


def test_the_api_schema_and_the_settings_list_every_option_of_the_dataclass(tmp_path: Path) -> None:
    names = {spec.name for spec in dataclasses.fields(c.RenderOptions)}
    openapi = create_app(Settings(home=tmp_path)).openapi()
    schemas = openapi["components"]["schemas"]
    form = next(schema for name, schema in schemas.items() if name.startswith("Body_create_render"))
    assert names <= set(form["properties"])
    assert names <= set(Settings(home=tmp_path).render.model_dump())
    public = schemas["RenderPublic"]["properties"]
    assert {"$ref": "#/components/schemas/SessionStatus"} in [public["status"], *public["status"].get("allOf", [])]
    assert schemas["SessionStatus"]["enum"] == [status.value for status in c.SessionStatus]
    assert schemas["Resolution"]["enum"] == [resolution.value for resolution in c.Resolution]


def test_stored_options_round_trip_and_old_rows_with_every_sink_field_still_read() -> None:
    options = c.RenderOptions(fps=30, sinks=(c.S3Sink(bucket="videos", prefix="a"), c.KvsSink(stream_name="s")))
    assert c.render_options(options_.stored(options)) == options
    old_row = {  # options as the API stored them before the sinks became a tagged union
        "fps": 25,
        "resolution": "720p",
        "sinks": [
            {
                "type": "kvs",
                "name": "",
                "bucket": "",
                "prefix": "",
                "endpoint_url": None,
                "region": None,
                "stream_name": "live",
            },
        ],
    }
    assert c.render_options(old_row).sinks == (c.KvsSink(stream_name="live"),)
    assert c.render_options(old_row).resolution is c.Resolution.HD_720


def test_dit_chunk_sizes_off_its_latent_grid_are_refused_naming_the_options() -> None:
    defaults = Settings().render
    assert options_.merge(defaults, {"family": "dit", "chunk_frames": 48, "i_frames": 8}).chunk_frames == 48
    with pytest.raises(ValidationError, match=r"multiples of 4 \(got chunk_frames=42, i_frames=3\)"):
        options_.merge(defaults, {"family": "dit", "chunk_frames": 42, "i_frames": 3})
    assert options_.merge(defaults, {"family": "warp", "chunk_frames": 42, "i_frames": 3}).i_frames == 3


def test_new_sessions_get_visemes_and_inputs_from_before_the_option_keep_loudness(tmp_path: Path) -> None:
    """`Bounds(new_sessions=...)`: the form, settings and CLI offer visemes; a stored row or a Temporal payload
    without the field (a session from before the option) means loudness, the dataclass default."""
    settings = Settings(home=tmp_path)
    assert options_.merge(settings.render, {}).lip_sync is c.LipSync.VISEMES
    assert options_.request_model().model_json_schema()["properties"]["lip_sync"]["default"] == "visemes"
    assert c.render_options({"fps": 25}).lip_sync is c.LipSync.LOUDNESS
    assert c.render_options(options_.stored(c.RenderOptions(lip_sync=c.LipSync.VISEMES))).lip_sync is c.LipSync.VISEMES
    assert c.RenderOptions().lip_sync is c.LipSync.LOUDNESS
