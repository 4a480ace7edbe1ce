"""The sink allow-lists, per tenant: who may publish to which bucket prefix, stream and endpoint, and which
Kinesis Video data endpoints a sink may connect to."""

from __future__ import annotations

import pytest

from monologue import contracts as c, options as options_
from monologue.settings import SinkSettings
from monologue.sink_policy import data_endpoint_refusal, endpoint_allowed, refusal

MINIO = "http://minio.internal:9000"
KVS_PLANE = "https://kvs.internal:8443"


def s3(bucket: str, prefix: str = "", endpoint_url: str | None = None) -> c.Sink:
    return c.S3Sink(bucket=bucket, prefix=prefix, endpoint_url=endpoint_url)


def kvs(stream_name: str, endpoint_url: str | None = None) -> c.Sink:
    return c.KvsSink(stream_name=stream_name, endpoint_url=endpoint_url)


def test_a_tenant_may_use_its_own_streams_and_not_another_tenants() -> None:
    allowed = SinkSettings(kvs_streams=["avatar-{tenant}-*"])
    assert refusal(kvs("avatar-a-1"), tenant="a", allowed=allowed) is None
    problem = refusal(kvs("avatar-b-1"), tenant="a", allowed=allowed)
    assert problem is not None and "MONOLOGUE_SINKS__KVS_STREAMS" in problem and "avatar-b-1" in problem
    assert refusal(kvs("avatar-b-1"), tenant="b", allowed=allowed) is None


@pytest.mark.parametrize(
    ("prefix", "problem"),
    [
        ("a", None),
        ("a/x", None),
        ("/a/x/", None),
        ("b", "MONOLOGUE_SINKS__S3_BUCKETS"),
        ("ab", "MONOLOGUE_SINKS__S3_BUCKETS"),
        ("", "MONOLOGUE_SINKS__S3_BUCKETS"),
        ("./a", "'..' segments"),
    ],
)
def test_s3_prefixes_match_by_whole_path_segments_of_the_tenants_own_prefix(prefix: str, problem: str | None) -> None:
    allowed = SinkSettings(s3_buckets=["videos/{tenant}"])
    found = refusal(s3("videos", prefix), tenant="a", allowed=allowed)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_a_prefix_with_a_dot_dot_segment_is_no_sink_at_all() -> None:
    """A server that normalises paths would write 'a/../b' under b/: the sink itself refuses it."""
    with pytest.raises(ValueError, match=r"may not contain '\.\.'"):
        s3("videos", "a/../b")


def test_a_bucket_alone_allows_any_prefix_and_no_other_bucket() -> None:
    allowed = SinkSettings(s3_buckets=["videos", "archive-*"])
    assert refusal(s3("videos", "anything/below"), tenant="a", allowed=allowed) is None
    assert refusal(s3("videos"), tenant="a", allowed=allowed) is None
    assert refusal(s3("archive-2024", "x"), tenant="a", allowed=allowed) is None
    assert refusal(s3("videos-other"), tenant="a", allowed=allowed) is not None
    assert refusal(s3("archive"), tenant="a", allowed=allowed) is not None


def test_a_trailing_star_matches_the_rest_of_the_last_prefix_segment_only() -> None:
    allowed = SinkSettings(s3_buckets=["videos/live/{tenant}-*"])
    assert refusal(s3("videos", "live/a-1/x"), tenant="a", allowed=allowed) is None
    assert refusal(s3("videos", "live/a"), tenant="a", allowed=allowed) is not None
    assert refusal(s3("videos", "live/b-1"), tenant="a", allowed=allowed) is not None


def test_s3_and_kvs_endpoints_are_separate_lists() -> None:
    allowed = SinkSettings(
        s3_buckets=["videos"], kvs_streams=["avatar"], s3_endpoints=[MINIO], kvs_endpoints=[KVS_PLANE]
    )
    assert refusal(s3("videos", endpoint_url=MINIO), tenant="a", allowed=allowed) is None
    assert refusal(kvs("avatar", endpoint_url=KVS_PLANE), tenant="a", allowed=allowed) is None
    s3_problem = refusal(s3("videos", endpoint_url=KVS_PLANE), tenant="a", allowed=allowed)
    assert s3_problem is not None and "MONOLOGUE_SINKS__S3_ENDPOINTS" in s3_problem
    kvs_problem = refusal(kvs("avatar", endpoint_url=MINIO), tenant="a", allowed=allowed)
    assert kvs_problem is not None and "MONOLOGUE_SINKS__KVS_ENDPOINTS" in kvs_problem


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("http://minio.internal:9000/", True),
        ("HTTP://Minio.Internal:9000", True),
        ("https://minio.internal:9000", False),  # another scheme
        ("http://minio.internal:9001", False),  # another port
        ("http://minio.internal", False),  # port 80
        ("http://minio.internal:9000.evil.com", False),
        ("http://minio.internal:9000@evil.com", False),  # user info: the host is evil.com
        ("http://evil.com/minio.internal:9000", False),
        ("http://minio.internal:9000/other", False),
        ("http://minio.internal.evil.com:9000", False),
    ],
)
def test_endpoints_match_by_scheme_host_port_and_path(url: str, ok: bool) -> None:
    assert endpoint_allowed(url, [MINIO + "/"]) == ok


def test_default_ports_are_the_same_endpoint_as_none_given() -> None:
    assert endpoint_allowed("https://kvs.internal:443", ["https://kvs.internal"])
    assert endpoint_allowed("http://kvs.internal", ["http://kvs.internal:80/"])


def test_host_wildcards_match_subdomains_for_kvs_endpoints_only() -> None:
    entries = ["https://*.kvs.internal"]
    assert endpoint_allowed("https://s-1.kvs.internal", entries, wildcards=True)
    assert endpoint_allowed("https://a.b.kvs.internal/", entries, wildcards=True)
    assert not endpoint_allowed("https://kvs.internal", entries, wildcards=True)
    assert not endpoint_allowed("https://evilkvs.internal", entries, wildcards=True)
    assert not endpoint_allowed("http://s-1.kvs.internal", entries, wildcards=True)
    assert not endpoint_allowed("https://s-1.kvs.internal", entries)  # S3 lists take no wildcards
    allowed = SinkSettings(s3_buckets=["videos"], s3_endpoints=entries)
    assert refusal(s3("videos", endpoint_url="https://s-1.kvs.internal"), tenant="a", allowed=allowed) is not None


def test_nothing_is_allowed_until_the_operator_lists_it() -> None:
    for sink in (s3("videos"), kvs("avatar")):
        assert refusal(sink, tenant="a", allowed=SinkSettings()) is not None


def test_a_tenant_that_could_widen_a_pattern_is_refused_everything() -> None:
    """Tenants are checked when keys are made; a name with '*' or '/' must still never reach a pattern."""
    allowed = SinkSettings(s3_buckets=["videos/{tenant}"], kvs_streams=["avatar-{tenant}"])
    for tenant in ("*", "a/b", "a*", "A", "a\n"):
        assert refusal(kvs(f"avatar-{tenant}"), tenant=tenant, allowed=allowed) is not None
        assert refusal(s3("videos", "a/b"), tenant=tenant, allowed=allowed) is not None


def test_the_apis_sink_options_are_checked_the_same_way() -> None:
    """What the API validates from a request is the contracts' own sink, so one policy checks both."""
    allowed = SinkSettings(kvs_streams=["avatar-{tenant}-*"])

    def sent(stream: str) -> c.Sink:
        request = options_.request_model().model_validate({"sinks": [{"type": "kvs", "stream_name": stream}]})
        sink: c.Sink = request.to_options().sinks[0]
        return sink

    assert refusal(sent("avatar-a-1"), tenant="a", allowed=allowed) is None
    assert refusal(sent("avatar-b-1"), tenant="a", allowed=allowed) is not None


@pytest.mark.parametrize(
    ("url", "region", "ok"),
    [
        ("https://s-1234abcd.kinesisvideo.us-west-2.amazonaws.com", "us-west-2", True),
        ("https://s-1234abcd.kinesisvideo.us-west-2.amazonaws.com:443/", "us-west-2", True),
        ("https://s-1.kinesisvideo.cn-north-1.amazonaws.com.cn", "cn-north-1", True),
        ("http://s-1234abcd.kinesisvideo.us-west-2.amazonaws.com", "us-west-2", False),  # not TLS
        ("https://s-1234abcd.kinesisvideo.eu-west-1.amazonaws.com", "us-west-2", False),  # another region
        ("https://kinesisvideo.us-west-2.amazonaws.com.evil.com", "us-west-2", False),
        ("https://evil.com", "us-west-2", False),
        ("https://169.254.169.254", "us-west-2", False),
        ("https://s-1.kinesisvideo.us-west-2.amazonaws.com:8443", "us-west-2", False),
    ],
)
def test_a_data_endpoint_from_aws_must_be_an_aws_kinesis_video_host(url: str, region: str, ok: bool) -> None:
    problem = data_endpoint_refusal(url, region=region, control_endpoint=None, allowed=SinkSettings())
    assert (problem is None) == ok, problem


def test_a_data_endpoint_from_a_custom_control_plane_must_be_in_kvs_endpoints() -> None:
    allowed = SinkSettings(kvs_endpoints=[KVS_PLANE, "https://*.data.internal"])
    assert data_endpoint_refusal(KVS_PLANE, region="us-east-1", control_endpoint=KVS_PLANE, allowed=allowed) is None
    assert (
        data_endpoint_refusal(
            "https://s-1.data.internal", region="us-east-1", control_endpoint=KVS_PLANE, allowed=allowed
        )
        is None
    )
    problem = data_endpoint_refusal(
        "http://169.254.169.254", region="us-east-1", control_endpoint=KVS_PLANE, allowed=allowed
    )
    assert problem is not None and "MONOLOGUE_SINKS__KVS_ENDPOINTS" in problem
    # An AWS host is not enough when the operator named its own control plane.
    aws = "https://s-1.kinesisvideo.us-east-1.amazonaws.com"
    assert data_endpoint_refusal(aws, region="us-east-1", control_endpoint=KVS_PLANE, allowed=allowed) is not None
