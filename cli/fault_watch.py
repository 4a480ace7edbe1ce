"""What a fault run watches while the fault lasts (cli/faults.py): the API's answers, as clients get them, and a
live session's playlist, as a viewer sees it grow.

The rule for answers (issue 28): during an outage of a service beneath it the API answers normally, or 503 with
Retry-After; never another 5xx, never a 503 without Retry-After, never no answer at all (`ANSWER_WITHIN_S`)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import httpx

from monologue.client import Client, auth
from monologue.errors import ApiError


class Fault(StrEnum):
    """The faults cli/faults.py injects (defined here, in a module `monologue bench` may import at start)."""

    TEMPORAL = "temporal"  # the Temporal server SIGKILLed, down for OUTAGE_S, started again on its database file
    POSTGRES = "postgres"  # PostgreSQL stopped (fast shutdown: connections cut) for OUTAGE_S, then started
    POSTGRES_CRASH = "postgres-crash"  # PostgreSQL SIGKILLed while sessions write, down OUTAGE_S, recovered from WAL
    # The node holding most sessions cut off from Temporal and storage until its sessions go on elsewhere, then let
    # back in: what it was doing lands late, and must be fenced (c.FENCING)
    PARTITION = "partition"
    S3_DOWN = "s3-down"  # SeaweedFS stopped for S3_OUTAGE_S, started again on its data
    S3_THROTTLE = "s3-throttle"  # the nodes' storage answers 30 % SlowDown / 500 / resets (some after the write)


ANSWER_WITHIN_S = 20.0  # longer than any retry the API makes (Temporal's client gives up after about 10 s)
# A create waits for a node to check its uploads, up to MONOLOGUE_API__VALIDATE_TIMEOUT_S (then 503): across a
# Temporal restart that is the outage, the nodes' reconnection and the check, which can pass ANSWER_WITHIN_S (seen
# once in CI: no answer within 20 s). Its bound is that setting plus one give-up of the Temporal client and a margin.
CREATE_MARGIN_S = 15.0
PROBE_EVERY_S = 0.25
CREATE_EVERY_S = 2.0


@dataclass
class Answers:
    """Status codes the API gave during the fault, and the answers that broke the rule."""

    codes: Counter[int] = field(default_factory=Counter)
    broken: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)  # renders a create made during the fault: checked like the rest

    def take(self, what: str, response: httpx.Response) -> None:
        self.codes[response.status_code] += 1
        if response.status_code == 503 and "retry-after" not in response.headers:
            self.broken.append(f"{what}: 503 without Retry-After")
        elif response.status_code >= 500 and response.status_code != 503:
            self.broken.append(f"{what}: {response.status_code} {response.text[:200]}")


class Prober:
    """Asks the API what clients ask (a session, the list, the health probe) every PROBE_EVERY_S, and, on a thread of
    its own (a create may wait out the client's retries), creates a render every CREATE_EVERY_S, until stopped."""

    def __init__(
        self, api_url: str, api_key: str, session_id: str, portrait: Path, audio: Path, *, validate_timeout_s: float
    ) -> None:
        self._url, self._key, self._session_id = api_url, api_key, session_id
        self._create_within_s = validate_timeout_s + CREATE_MARGIN_S
        self._portrait, self._audio = portrait, audio
        self._halt = threading.Event()
        self._threads = [threading.Thread(target=target, daemon=True) for target in (self._reads, self._creates)]
        self.answers = Answers()

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _reads(self) -> None:
        with httpx.Client(base_url=self._url, headers=auth(self._key), timeout=ANSWER_WITHIN_S) as http:
            while not self._halt.wait(PROBE_EVERY_S):
                for path in (f"/v1/renders/{self._session_id}", "/v1/renders?limit=5", "/healthz"):
                    try:
                        self.answers.take(f"GET {path}", http.get(path))
                    except httpx.HTTPError as err:
                        self.answers.broken.append(f"GET {path}: no answer ({type(err).__name__})")

    def _creates(self) -> None:
        while not self._halt.wait(CREATE_EVERY_S):
            self._create()

    def _create(self) -> None:
        from cli.benches.cluster_live import OPTIONS

        try:
            # One attempt: the watch counts the API's answers, and a retried create would hide them.
            with Client(self._url, api_key=self._key, timeout_s=self._create_within_s, create_attempts=1) as client:
                session = client.create_render(portrait=self._portrait, audio=self._audio, options=OPTIONS)
            self.answers.codes[201] += 1
            self.answers.created.append(session.id)
        except ApiError as err:
            self.answers.codes[err.status] += 1
            if err.status == 503 and err.retry_after_s is None:
                self.answers.broken.append("POST /v1/renders: 503 without Retry-After")
            elif err.status >= 500 and err.status != 503:
                self.answers.broken.append(f"POST /v1/renders: {err.status} {err}")
        except httpx.HTTPError as err:
            self.answers.broken.append(f"POST /v1/renders: no answer ({type(err).__name__})")

    def stop(self) -> Answers:
        self._halt.set()
        for thread in self._threads:
            thread.join(timeout=2 * self._create_within_s)
        return self.answers


class PlaylistWatch(threading.Thread):
    """Reads a live session's playlist every 0.2 s and notes when it grew: the longest wait between two new
    segments is the stall a viewer saw."""

    def __init__(self, stream_url: str, api_key: str) -> None:
        super().__init__(daemon=True)
        self._url, self._key = stream_url, api_key
        self._halt = threading.Event()
        self.grew_at: list[float] = []  # monotonic
        self._count = 0

    def run(self) -> None:
        with httpx.Client(headers=auth(self._key), timeout=10) as http:
            while not self._halt.wait(0.2):
                try:
                    response = http.get(self._url)
                except httpx.HTTPError:
                    continue
                if response.status_code != 200:
                    continue
                count = sum(1 for line in response.text.splitlines() if line.startswith("seg-"))
                if count > self._count:
                    self._count = count
                    self.grew_at.append(time.monotonic())
                if response.text.rstrip().endswith("#EXT-X-ENDLIST"):
                    return

    def longest_stall_s(self) -> float:
        gaps = [later - earlier for earlier, later in zip(self.grew_at, self.grew_at[1:], strict=False)]
        return max(gaps, default=0.0)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=15)
