"""Inputs by URL on the real stack: fetched from an address the operator allows (here 127.0.0.1) and checked on a
node like an upload; refused, before any request and with nothing started, for an address it does not allow (another
loopback address, the cloud metadata address), a bucket it does not list, a host that can be no name or a port out of
range, or a request naming both a file and a URL.
(s3:// inputs from an allowed bucket: tests/test_production_config.py, on SeaweedFS.)"""

from __future__ import annotations

import numpy as np
import pytest

from cli.stack import Stack
from monologue.media import decode_wav, normalise_audio
from tests.helpers import post, wait_done, wav_bytes, workflow_count
from tests.local_server import Answer, LocalServer

pytestmark = pytest.mark.slow


def _create(api_url: str, **fields: str) -> tuple[int, dict[str, object]]:
    answer = post(f"{api_url}/v1/renders", data=fields, timeout=120)
    return answer.status_code, answer.json()


def test_inputs_at_an_allowed_address_are_fetched_and_checked_like_uploads(
    api_url: str, sample_portrait: bytes, sample_speech: bytes
) -> None:
    speech = wav_bytes(decode_wav(normalise_audio(sample_speech).wav)[:16_000])
    with LocalServer("127.0.0.1") as server:
        server.routes["/face.jpg"] = Answer(body=sample_portrait)
        server.routes["/speech.wav"] = Answer(body=speech)
        server.routes["/moved.jpg"] = Answer(302, headers={"Location": "/face.jpg"})
        server.routes["/notes.txt"] = Answer(body=b"not a picture")
        status, created = _create(api_url, portrait_url=server.url("/moved.jpg"), audio_url=server.url("/speech.wav"))
        assert status == 201, created
        status, bad = _create(api_url, portrait_url=server.url("/notes.txt"), audio_url=server.url("/speech.wav"))
        assert status == 422 and "portrait" in str(bad["detail"])  # the upload's own check, from a node
        status, missing = _create(api_url, portrait_url=server.url("/gone.jpg"), audio_url=server.url("/speech.wav"))
        assert status == 422 and "404" in str(missing["detail"]) and "portrait_url" in str(missing["detail"])
    render = wait_done(api_url, str(created["id"]))
    assert render["status"] == "completed" and render["progress"]["frames_total"] == 25, render["error"]


def test_addresses_and_buckets_the_operator_has_not_allowed_are_refused_and_nothing_starts(
    stack: Stack, api_url: str, sample_portrait: bytes
) -> None:
    before = workflow_count(stack.settings)
    with LocalServer("127.0.0.2") as internal:  # loopback, but not the range the stack allows (127.0.0.1/32)
        internal.routes["/face.jpg"] = Answer(body=sample_portrait)
        for url in (internal.url("/face.jpg"), "http://169.254.169.254/latest/meta-data/"):
            status, problem = _create(api_url, portrait_url=url, audio_url=internal.url("/speech.wav"))
            assert status == 422 and "MONOLOGUE_OUTBOUND__ALLOWED_RANGES" in str(problem["detail"]), problem
        assert internal.received == []  # refused before a connection was made
    status, problem = _create(api_url, portrait_url="s3://somebody-elses/face.jpg", audio_url="s3://inputs/x.wav")
    assert status == 422 and "MONOLOGUE_INPUTS__S3_BUCKETS" in str(problem["detail"])
    status, problem = _create(api_url, portrait_url="ftp://example.com/face.jpg", audio_url="https://example.com/a")
    assert status == 422 and "https://" in str(problem["detail"])
    both = post(
        f"{api_url}/v1/renders",
        files={"portrait": ("p.jpg", sample_portrait), "audio": ("a.wav", wav_bytes(np.zeros(1600)))},
        data={"portrait_url": "https://example.com/face.jpg"},
        timeout=60,
    )
    assert both.status_code == 422 and "not both" in both.json()["detail"]
    assert workflow_count(stack.settings) == before


def test_a_host_that_can_be_no_name_or_a_port_out_of_range_is_a_422_and_nothing_starts(
    stack: Stack, api_url: str
) -> None:
    """What IDNA and the resolver raise on (a 500 once) is a refusal naming the field."""
    before = workflow_count(stack.settings)
    for url, problem in (
        ("https://xn--a.com/face.jpg", "host is not a valid name"),
        (f"https://{'a' * 64}.com/face.jpg", "host is not a valid name"),
        ("https://example.com:99999/face.jpg", "port must be 1-65535"),
    ):
        answer = post(
            f"{api_url}/v1/renders",
            files={"audio": ("a.wav", wav_bytes(np.zeros(1600)))},
            data={"portrait_url": url},
            timeout=60,
        )
        assert answer.status_code == 422, (url, answer.status_code, answer.text)
        detail = str(answer.json()["detail"])
        assert "portrait_url" in detail and problem in detail, (url, detail)
    assert workflow_count(stack.settings) == before
