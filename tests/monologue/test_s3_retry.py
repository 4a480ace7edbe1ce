"""The storage retries' pauses (monologue/s3_retry.py): while S3 does not answer at all they stay within a second,
so a store that is back is used within one; while it throttles they back off further, to two seconds."""

from __future__ import annotations

import random

import botocore.exceptions as bce
import pytest

from monologue import s3_retry
from monologue.errors import StorageUnreachable, TransientError


def _pauses(monkeypatch: pytest.MonkeyPatch, failure: Exception, failures: int = 12) -> list[float]:
    """The pauses `retrying` takes before an action that fails `failures` times with `failure` passes."""
    pauses: list[float] = []
    monkeypatch.setattr(s3_retry.time, "sleep", pauses.append)
    random.seed(5)
    calls = iter(range(failures + 1))

    def action() -> str:
        if next(calls) < failures:
            raise failure
        return "stored"

    assert s3_retry.retrying("seg-00001.m4s", action, retry_for_s=600) == "stored"
    assert len(pauses) == failures
    return pauses


def test_a_store_that_does_not_answer_is_tried_again_at_least_every_second(monkeypatch: pytest.MonkeyPatch) -> None:
    refused = bce.EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
    assert isinstance(s3_retry.translate(refused, "k"), StorageUnreachable)
    pauses = _pauses(monkeypatch, StorageUnreachable("refused"))
    assert max(pauses) <= s3_retry.RETRY_MAX_WAIT_DOWN_S
    assert pauses[-1] >= s3_retry.RETRY_MAX_WAIT_DOWN_S / 2  # it did back off to the cap


def test_a_throttling_store_gets_a_longer_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses = _pauses(monkeypatch, TransientError("SlowDown"))
    assert max(pauses) > s3_retry.RETRY_MAX_WAIT_DOWN_S
    assert max(pauses) <= s3_retry.RETRY_MAX_WAIT_S
