"""Inputs given by URL (`portrait_url`, `audio_url`): fetched by the API and then staged and checked on a node
exactly like an upload (`api/submit.py`), so the same limits and the same validation apply.

Why the API fetches (and not the node that checks the input): the API already holds a request's inputs in memory
under the upload limit and stages them; fetching here keeps the node's check one path for both, keeps requests to
caller-chosen URLs off the nodes (which hold the sinks' and the GPU hosts' credentials), and makes a refused URL a
422 before any node is asked. https URLs go through `monologue.outbound` (public addresses only, checked on the
address connected to, each redirect too); `s3://bucket/key` only from the buckets MONOLOGUE_INPUTS__S3_BUCKETS
allows the tenant, with the API's credentials (boto3's chain)."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from botocore.exceptions import BotoCoreError, ClientError

from monologue import outbound, sink_policy
from monologue.errors import AddressRefused, InputError, InputTooLarge
from monologue.s3_presign import s3_client

from .deps import Services


async def fetch_input(services: Services, url: str, field: str, tenant: str) -> bytes:
    """The bytes at `url` for the form field `field`; AddressRefused, InputTooLarge or InputError say why not."""
    what = f"{field}_url"
    settings = services.settings
    limit = settings.limits.max_upload_bytes
    if url.startswith("s3://"):
        timeout_s = settings.inputs.fetch_timeout_s
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(_s3_object, services, url, what, tenant, limit), timeout=timeout_s
            )
        except TimeoutError:
            raise InputError(
                f"{what}: {url} did not arrive within {timeout_s:g} s (MONOLOGUE_INPUTS__FETCH_TIMEOUT_S)"
            ) from None
    return await outbound.fetch(
        url,
        what=what,
        outbound=settings.outbound,
        limit_bytes=limit,
        timeout_s=settings.inputs.fetch_timeout_s,
        max_redirects=settings.inputs.max_redirects,
    )


def _s3_object(services: Services, url: str, what: str, tenant: str, limit: int) -> bytes:
    parts = urlsplit(url)
    bucket, key = parts.netloc, parts.path.lstrip("/")
    if not bucket or not key or parts.query or parts.fragment:
        raise InputError(f"{what}: {url!r} is not s3://bucket/key")
    allowed = services.settings.inputs.s3_buckets
    if not sink_policy.s3_object_allowed(allowed, tenant=tenant, bucket=bucket, key=key):
        raise AddressRefused(
            f"{what}: tenant {tenant!r} may not read s3://{bucket}/{key} (MONOLOGUE_INPUTS__S3_BUCKETS lists the"
            " buckets inputs may come from)"
        )
    client = s3_client(endpoint_url=services.settings.inputs.s3_endpoint_url, region=None)
    try:
        response = client.get_object(Bucket=bucket, Key=key)
        if int(response.get("ContentLength") or 0) > limit:
            response["Body"].close()
            raise InputTooLarge(
                f"{what}: larger than the limit of {limit} bytes (setting MONOLOGUE_LIMITS__MAX_UPLOAD_BYTES)"
            )
        data: bytes = response["Body"].read(limit + 1)
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "")
        raise InputError(f"{what}: s3://{bucket}/{key} could not be read ({code or err})") from None
    except BotoCoreError as err:
        raise InputError(f"{what}: s3://{bucket}/{key} could not be read ({err})") from None
    if len(data) > limit:
        raise InputTooLarge(
            f"{what}: larger than the limit of {limit} bytes (setting MONOLOGUE_LIMITS__MAX_UPLOAD_BYTES)"
        )
    if not data:
        raise InputError(f"{what}: s3://{bucket}/{key} is empty")
    return data
