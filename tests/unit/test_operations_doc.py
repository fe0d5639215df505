"""docs/operations.md names only metrics a real client exports, and describes every family it exports.

The names are read from a real client's endpoint (metrics on at level DEBUG, so the per-stream
families are there too; on two buckets, so the per-bucket ones are); a name in the page may carry a histogram's or counter's sample suffix.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from s3stream.assembly import open_client
from tests.support.configs import small_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
NAME = re.compile(r"\bs3stream_[a-z0-9_]*[a-z0-9]\b")
SUFFIXES = ("", "_total", "_bucket", "_count", "_sum")


async def _exported(tmp_path: Path) -> dict[str, str]:
    """Family name (as the parser gives it: counters without ``_total``) -> type."""
    config = small_config(metrics_exporter_uri="prometheus://?host=127.0.0.1&port=0", metrics_level="DEBUG")
    # two buckets: the per-bucket families (bucket health) are exported only with a bucket list
    name = tmp_path.name
    client = await open_client(tmp_path, bucket_uri=f"0@mem://{name}-a,1@mem://{name}-b", config=config)
    try:
        assert client.metrics_endpoint is not None
        body = urllib.request.urlopen(client.metrics_endpoint, timeout=10).read().decode()
    finally:
        await client.close()
    return {f.name: f.type for f in text_string_to_metric_families(body) if f.name.startswith("s3stream_")}


def _sample_names(families: dict[str, str]) -> set[str]:
    names = set()
    for name, kind in families.items():
        if kind == "counter":
            names.update({name, f"{name}_total"})
        elif kind == "histogram":
            names.update({name, f"{name}_bucket", f"{name}_count", f"{name}_sum"})
        else:
            names.add(name)
    return names


async def test_every_metric_named_in_the_doc_is_exported(tmp_path: Path) -> None:
    exported = _sample_names(await _exported(tmp_path))
    named = set(NAME.findall(DOC.read_text()))
    assert len(named) > 30, "the page names too few metrics: the pattern found nothing?"
    unknown = sorted(named - exported)
    assert not unknown, f"docs/operations.md names metrics no client exports: {unknown}"


async def test_every_exported_family_is_described_in_the_doc(tmp_path: Path) -> None:
    families = await _exported(tmp_path)
    assert len(families) > 30
    text = DOC.read_text()
    documented = {n for n in NAME.findall(text)}
    missing = sorted(
        name
        for name, kind in families.items()
        if f"{name}_total" not in documented and name not in documented
    )
    assert not missing, f"exported but not in docs/operations.md: {missing}"
    for name, kind in families.items():
        shown = f"{name}_total" if kind == "counter" else name
        row = next((line for line in text.splitlines() if f"`{shown}`" in line), None)
        assert row is not None, f"{shown} has no line of its own in docs/operations.md"
