"""The metrics switch: AutoMQ's exporter URI and level keys, parsed and validated with the config."""

from __future__ import annotations

import pytest

from s3stream.config import Config
from s3stream.errors import InvalidArgumentError
from s3stream.metrics.uri import ExporterAddress, parse_exporter_uri, parse_level


@pytest.mark.parametrize(
    ("uri", "address"),
    [
        ("prometheus://?host=127.0.0.1&port=9464", ExporterAddress("127.0.0.1", 9464)),
        ("prometheus://?port=0", ExporterAddress("127.0.0.1", 0)),
        ("prometheus://", ExporterAddress("127.0.0.1", 9464)),
        ("prometheus:///?host=0.0.0.0&port=65535", ExporterAddress("0.0.0.0", 65535)),
        ("  prometheus://?host=::1&port=9100 ", ExporterAddress("::1", 9100)),
    ],
)
def test_a_prometheus_uri_gives_the_address_to_listen_on(uri: str, address: ExporterAddress) -> None:
    assert parse_exporter_uri(uri) == address


@pytest.mark.parametrize("uri", ["", "   "])
def test_an_empty_uri_means_metrics_off(uri: str) -> None:
    assert parse_exporter_uri(uri) is None


@pytest.mark.parametrize(
    "uri",
    [
        "otlp://?endpoint=http://x:4317",
        "http://127.0.0.1:9464/metrics",
        "prometheus://127.0.0.1:9464",
        "prometheus://?host=127.0.0.1&port=65536",
        "prometheus://?port=-1",
        "prometheus://?port=abc",
        "prometheus://?port=９４６４",
        "prometheus://?port=1&port=2",
        "prometheus://?host=&port=1",
        "prometheus://?host=a/b",
        "prometheus://?hots=127.0.0.1",
        "prometheus://?host=127.0.0.1&port=1#frag",
        "prometheus://?&&==",
        "prometheus:/metrics",
    ],
)
def test_a_bad_uri_is_refused_naming_the_key(uri: str) -> None:
    with pytest.raises(InvalidArgumentError, match=r"s3\.telemetry\.metrics\.exporter\.uri"):
        parse_exporter_uri(uri)


def test_the_config_checks_the_uri_from_every_source() -> None:
    assert Config().metrics_exporter_uri == ""  # off by default
    config = Config.from_sources(env={"S3STREAM_S3_TELEMETRY_METRICS_EXPORTER_URI": "prometheus://?port=0"})
    assert config.metrics_exporter_uri == "prometheus://?port=0"
    assert config.as_keys()["s3.telemetry.metrics.exporter.uri"] == "prometheus://?port=0"
    with pytest.raises(InvalidArgumentError, match=r"s3\.telemetry\.metrics\.exporter\.uri"):
        Config.from_sources(env={"S3STREAM_S3_TELEMETRY_METRICS_EXPORTER_URI": "prometheus://?port=x"})
    with pytest.raises(InvalidArgumentError, match=r"s3\.telemetry\.metrics\.exporter\.uri"):
        Config(metrics_exporter_uri="statsd://localhost")


def test_the_level_is_info_or_debug() -> None:
    assert Config().metrics_level == "INFO"
    assert Config(metrics_level="DEBUG").metrics_level == "DEBUG"
    assert parse_level("debug") == "DEBUG"
    assert parse_level(" Info ") == "INFO"
    with pytest.raises(InvalidArgumentError, match=r"s3\.telemetry\.metrics\.level"):
        Config(metrics_level="TRACE")
    with pytest.raises(InvalidArgumentError, match=r"s3\.telemetry\.metrics\.level"):
        parse_level("TRACE")
