"""`Idempotency-Key` on the real stack (SQLite; PostgreSQL across two API processes is in tests/test_two_apis.py):
duplicates sent at once make one session and one workflow; the key with another request is a 422 saying so; a
request that failed frees its key."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from threading import Barrier

import httpx
import numpy as np
import pytest

from api.submit import TERMINAL
from cli.stack import Stack
from tests.helpers import api_key, poll, post, wav_bytes, workflow_count

pytestmark = pytest.mark.slow
DUPLICATES = 4


def _create(api_url: str, portrait: bytes, audio: bytes, key: str, **options: str) -> httpx.Response:
    files = {"portrait": ("p.jpg", portrait), "audio": ("a.wav", audio)}
    return post(f"{api_url}/v1/renders", files=files, data=options, headers={"Idempotency-Key": key}, timeout=120)


def _cancel(api_url: str, session_id: str) -> None:
    post(f"{api_url}/v1/renders/{session_id}/cancel", timeout=30)
    poll(api_url, session_id, lambda s: s["status"] in TERMINAL, api_key=api_key(api_url))


def test_duplicates_sent_at_once_make_one_session_and_the_key_names_its_request(
    stack: Stack, api_url: str, sample_portrait: bytes
) -> None:
    audio = wav_bytes(np.zeros(16_000 * 2))
    before = workflow_count(stack.settings)
    barrier = Barrier(DUPLICATES)

    def send(_: int) -> httpx.Response:
        barrier.wait()
        return _create(api_url, sample_portrait, audio, "order-1234")

    with ThreadPoolExecutor(DUPLICATES) as pool:
        answers = list(pool.map(send, range(DUPLICATES)))
    assert [answer.status_code for answer in answers] == [201] * DUPLICATES, [a.text for a in answers]
    ids = {answer.json()["id"] for answer in answers}
    try:
        assert len(ids) == 1
        replayed = [answer.headers.get("idempotent-replayed") for answer in answers]
        assert replayed.count("true") == DUPLICATES - 1 and replayed.count(None) == 1
        assert workflow_count(stack.settings) == before + 1  # one session workflow for all of them

        other = _create(api_url, sample_portrait, audio, "order-1234", seed="9")
        assert other.status_code == 422 and other.headers["content-type"] == "application/problem+json"
        problem = other.json()
        assert "Idempotency-Key" in problem["detail"] and "different request" in problem["detail"]
        assert problem["status"] == 422 and problem["title"] == "Unprocessable Entity"
        assert workflow_count(stack.settings) == before + 1
    finally:
        _cancel(api_url, ids.pop())


def test_a_request_that_failed_frees_its_key(api_url: str, sample_portrait: bytes) -> None:
    audio = wav_bytes(np.zeros(16_000))
    refused = _create(api_url, b"not an image", audio, "order-5678")
    assert refused.status_code == 422 and "portrait" in refused.json()["detail"]
    made = _create(api_url, sample_portrait, audio, "order-5678")  # another request now, but the key is free
    assert made.status_code == 201 and "idempotent-replayed" not in made.headers
    try:
        assert _create(api_url, sample_portrait, audio, "order-5678").json()["id"] == made.json()["id"]
        bad_key = _create(api_url, sample_portrait, audio, "has spaces")
        assert bad_key.status_code == 422 and "Idempotency-Key" in bad_key.json()["detail"]
    finally:
        _cancel(api_url, made.json()["id"])
