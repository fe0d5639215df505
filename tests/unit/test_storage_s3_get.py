"""The direct ranged GET's pieces (s3stream.storage.s3get): its SigV4 headers are botocore's, byte
for byte, and it is used only where it applies."""

from __future__ import annotations

import datetime
from unittest import mock

import botocore.auth
import botocore.awsrequest
import botocore.credentials
import pytest

from s3stream.storage.s3get import EMPTY_SHA256, SigV4Signer, ranged_getter_for

NOW = datetime.datetime(2026, 11, 27, 10, 30, 5, tzinfo=datetime.UTC)


def _botocore_authorization(url: str, range_header: str, region: str) -> dict[str, str]:
    credentials = botocore.credentials.Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    request = botocore.awsrequest.AWSRequest(method="GET", url=url, headers={"Range": range_header})
    request.context["payload_signing_enabled"] = True
    signer = botocore.auth.S3SigV4Auth(credentials, "s3", region)
    with mock.patch("botocore.auth.get_current_datetime", return_value=NOW.replace(tzinfo=None)):
        signer.add_auth(request)
    return {k: str(v) for k, v in request.headers.items()}


@pytest.mark.parametrize(
    ("path", "range_header", "region"),
    [
        ("/bucket/ab12/ns/0000000000000042", "bytes=0-8191", "us-east-1"),
        ("/s3stream-test/p%3Dx/a%2Bb%2Cc%40d%21e/f-g_h.i", "bytes=4194304-", "eu-west-3"),
    ],
)
def test_signature_is_botocores(path: str, range_header: str, region: str) -> None:
    expected = _botocore_authorization(f"http://127.0.0.1:7480{path}", range_header, region)
    signer = SigV4Signer(
        access_key="AKIDEXAMPLE", secret_key="wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", region=region
    )
    got = signer.headers("GET", "127.0.0.1:7480", path, {"range": range_header}, now=NOW)
    assert got["x-amz-content-sha256"] == expected["X-Amz-Content-SHA256"] == EMPTY_SHA256
    assert got["x-amz-date"] == expected["X-Amz-Date"]
    assert got["Authorization"] == expected["Authorization"]


def test_signing_key_is_derived_once_a_day() -> None:
    signer = SigV4Signer(access_key="a", secret_key="s", region="us-east-1")
    first = signer.signing_key("20261127")
    assert signer.signing_key("20261127") is first
    assert signer.signing_key("20261128") != first


@pytest.mark.parametrize(
    ("endpoint", "path_style", "keys", "applies"),
    [
        ("http://127.0.0.1:7480", True, ("a", "s"), True),
        ("http://minio:9000/", True, ("a", "s"), True),
        ("https://s3.example.com", True, ("a", "s"), False),  # botocore's TLS set-up stays
        ("http://127.0.0.1:7480", False, ("a", "s"), False),  # virtual-hosted addressing
        ("http://127.0.0.1:7480", True, (None, None), False),  # botocore's credential chain
        (None, True, ("a", "s"), False),  # AWS: botocore resolves the endpoint
    ],
)
def test_used_only_where_it_applies(
    endpoint: str | None, path_style: bool, keys: tuple[str | None, str | None], applies: bool
) -> None:
    getter = ranged_getter_for(
        endpoint=endpoint,
        path_style=path_style,
        bucket="b",
        region="us-east-1",
        access_key=keys[0],
        secret_key=keys[1],
        user_agent="t",
        connections_max=4,
        connect_timeout_s=1.0,
    )
    assert (getter is not None) == applies


def test_not_used_when_the_environment_proxies_the_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    def getter() -> object:
        return ranged_getter_for(
            endpoint="http://127.0.0.1:7480",
            path_style=True,
            bucket="b",
            region="us-east-1",
            access_key="a",
            secret_key="s",
            user_agent="t",
            connections_max=4,
            connect_timeout_s=1.0,
        )

    for name in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert getter() is not None
    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
    assert getter() is None  # botocore would go through the proxy
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    assert getter() is not None
