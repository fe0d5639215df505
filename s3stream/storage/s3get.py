"""Ranged GETs without botocore: SigV4-signed requests sent straight through aiohttp.

A ranged GetObject through aiobotocore costs ~2-3 ms of client CPU before any byte of its body is
read (request model, parameter validation, endpoint rules, a dozen event hooks, the signer's
generic canonicalisation, response parsing): more than reading 1 MiB of body. The read path makes
one such GET per object index and per merged run of blocks, so on a catch-up read of 4 MiB objects
that fixed cost was as much CPU as the body bytes. :class:`RangedGetter` signs and sends the one
request shape the read path needs itself, for ~0.6 ms.

What it covers, and nothing else (every other request, and any ranged GET outside these
conditions, goes through botocore as before; :func:`ranged_getter_for` decides):

* an ``http://`` endpoint with path-style addressing (MinIO, Ceph RGW, test servers; an
  ``https://`` endpoint keeps botocore's TLS set-up, CA bundle included);
* static credentials (the config's keys or ``KAFKA_S3_*``): no session token, no refresh;
* no proxy for the endpoint in the environment (``HTTP_PROXY`` / ``NO_PROXY``, which botocore honours);
* a GET with a ``Range`` header and no query string: S3 returns no checksum for a range, so there is
  no response checksum for botocore to validate either.

The request is what botocore sends for the same call, less the headers S3 ignores: ``Host``,
``Range``, ``x-amz-date`` and ``x-amz-content-sha256`` (the empty body's hash) signed with SigV4
(the signing key is derived once per day). The key's path is percent-encoded once, as S3's
canonical URI wants (keys are ASCII letters, digits and ``-_.=+,@!`` and ``/``:
:mod:`s3stream.storage.keys`) and sent exactly so. An answer other than 200/206 raises botocore's
``ClientError`` with the error XML's code, so :func:`~s3stream.storage.s3client.translate_error`
maps it as it maps botocore's (404/NoSuchKey, 403, 416, 5xx...); transport errors are aiohttp's,
which it maps too. The body is read by :func:`read_stream` (aiohttp's
chunks joined once; a short body raises botocore's ``IncompleteReadError``).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import re
import urllib.request
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import botocore.exceptions
import yarl

from s3stream.storage.s3quickack import use_quick_acks

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
"""``x-amz-content-sha256`` of a request without a body."""
ALGORITHM = "AWS4-HMAC-SHA256"
_ERROR_CODE_RE = re.compile(rb"<Code>([^<]{1,200})</Code>")
_ERROR_MESSAGE_RE = re.compile(rb"<Message>([^<]{0,500})</Message>")
ERROR_BODY_MAX_BYTES = 64 * 1024
"""Most of an error answer read to find its code."""


async def read_stream(content: aiohttp.StreamReader, content_length: object) -> bytes:
    """A response body off aiohttp's stream: its chunks as they arrived, joined once (one copy of
    every byte; ``read()`` makes more). A body shorter than ``content_length`` raises botocore's
    ``IncompleteReadError`` (transient)."""
    expected = None if content_length is None else int(str(content_length))
    raise_limit = getattr(content, "set_read_chunk_size", None)  # not in every aiohttp
    if expected is not None and raise_limit is not None:
        raise_limit(expected)  # as read() does: no pausing the socket midway
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk, end_of_http_chunk = await content.readchunk()
        if chunk:
            chunks.append(chunk)
            size += len(chunk)
        elif not end_of_http_chunk:
            break  # (b"", False): the end of the body
    if expected is not None and size != expected:
        raise botocore.exceptions.IncompleteReadError(actual_bytes=size, expected_bytes=expected)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class SigV4Signer:
    """SigV4 headers of a body-less S3 request with static credentials (the signing key is cached
    for the UTC day it was derived for)."""

    def __init__(self, *, access_key: str, secret_key: str, region: str) -> None:
        self._access_key = access_key
        self._secret_key = secret_key
        self._region = region
        self._key_day = ""
        self._key = b""

    def signing_key(self, day: str) -> bytes:
        if day != self._key_day:
            key = hmac.new(("AWS4" + self._secret_key).encode(), day.encode(), hashlib.sha256).digest()
            for part in (self._region, "s3", "aws4_request"):
                key = hmac.new(key, part.encode(), hashlib.sha256).digest()
            self._key_day, self._key = day, key
        return self._key

    def headers(
        self,
        method: str,
        host: str,
        path: str,
        extra: dict[str, str],
        *,
        now: datetime.datetime | None = None,
    ) -> dict[str, str]:
        """The headers to send (``Authorization`` included, ``Host`` left to aiohttp) for ``method``
        on ``path`` (already percent-encoded) of ``host`` with the lower-case ``extra`` headers."""
        amz_date = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%dT%H%M%SZ")
        day = amz_date[:8]
        signed = {"host": host, "x-amz-content-sha256": EMPTY_SHA256, "x-amz-date": amz_date, **extra}
        names = sorted(signed)
        signed_names = ";".join(names)
        canonical = "\n".join(
            (
                method,
                path,
                "",  # no query string
                "".join(f"{name}:{signed[name].strip()}\n" for name in names),
                signed_names,
                EMPTY_SHA256,
            )
        )
        scope = f"{day}/{self._region}/s3/aws4_request"
        to_sign = f"{ALGORITHM}\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        signature = hmac.new(self.signing_key(day), to_sign.encode(), hashlib.sha256).hexdigest()
        del signed["host"]
        signed["Authorization"] = (
            f"{ALGORITHM} Credential={self._access_key}/{scope}, SignedHeaders={signed_names}, "
            f"Signature={signature}"
        )
        return signed


class RangedGetter:
    """Ranged GETs of one bucket through its own aiohttp session (see the module docstring)."""

    def __init__(
        self,
        *,
        endpoint: str,
        bucket: str,
        signer: SigV4Signer,
        user_agent: str,
        connections_max: int,
        connect_timeout_s: float,
    ) -> None:
        split = urlsplit(endpoint)
        self._origin = f"{split.scheme}://{split.netloc}"
        self._host = split.netloc
        self._base_path = split.path.rstrip("/") + "/" + quote(bucket, safe="") + "/"
        self._signer = signer
        self._user_agent = user_agent
        self._connections_max = connections_max
        self._connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _open_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._connections_max)
            use_quick_acks(connector)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s),
                skip_auto_headers=("Accept", "Accept-Encoding", "Content-Type", "User-Agent"),
                auto_decompress=False,
            )
        return self._session

    async def get(self, full_key: str, range_header: str) -> tuple[bytes, str]:
        """The body of ``GET full_key`` with ``Range: range_header`` and its Content-Range."""
        session = self._open_session()
        path = self._base_path + quote(full_key, safe="/")
        headers = self._signer.headers("GET", self._host, path, {"range": range_header})
        headers["User-Agent"] = self._user_agent
        url = yarl.URL(self._origin + path, encoded=True)
        async with session.get(url, headers=headers, allow_redirects=False) as response:
            if response.status not in (200, 206):
                raise await _client_error(response)
            data = await read_stream(response.content, response.headers.get("Content-Length"))
            return data, response.headers.get("Content-Range", "")

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


async def _client_error(response: aiohttp.ClientResponse) -> botocore.exceptions.ClientError:
    """botocore's ClientError for an S3 error answer (code from its XML, else the status)."""
    body = await response.content.read(ERROR_BODY_MAX_BYTES)
    code_match = _ERROR_CODE_RE.search(body)
    message_match = _ERROR_MESSAGE_RE.search(body)
    code = code_match.group(1).decode("utf-8", "replace") if code_match else str(response.status)
    message = message_match.group(1).decode("utf-8", "replace") if message_match else response.reason or ""
    parsed: Any = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": response.status},
    }
    return botocore.exceptions.ClientError(parsed, "GetObject")


def _proxied(netloc: str) -> bool:
    """Whether the environment (``HTTP_PROXY``, ``NO_PROXY``) sends plain-HTTP requests to ``netloc``
    through a proxy, as botocore would."""
    proxies = urllib.request.getproxies()
    return "http" in proxies and not urllib.request.proxy_bypass(netloc.rpartition("@")[2])


def ranged_getter_for(
    *,
    endpoint: str | None,
    path_style: bool,
    bucket: str,
    region: str,
    access_key: str | None,
    secret_key: str | None,
    user_agent: str,
    connections_max: int,
    connect_timeout_s: float,
) -> RangedGetter | None:
    """A :class:`RangedGetter` where it applies (see the module docstring), else None."""
    if endpoint is None or not path_style or access_key is None or secret_key is None:
        return None
    split = urlsplit(endpoint)
    if split.scheme != "http" or not split.netloc or split.query or split.fragment:
        return None
    if _proxied(split.netloc):
        return None  # botocore sends through the environment's proxy: so do its requests
    signer = SigV4Signer(access_key=access_key, secret_key=secret_key, region=region)
    return RangedGetter(
        endpoint=endpoint,
        bucket=bucket,
        signer=signer,
        user_agent=user_agent,
        connections_max=connections_max,
        connect_timeout_s=connect_timeout_s,
    )
