"""Bounds on what fitcheck takes from a Hub endpoint: bytes per response and seconds per response body.

``huggingface_hub`` streams a file to the cache whatever its size (a 1 GB ``config.json``, or a server
whose HEAD says 100 bytes and whose GET sends a gigabyte, is written whole before fitcheck's bounded
read refuses it), and a server that sends one byte every few seconds never trips its per-read
timeout. So, while a Hub id is resolved, the client's HTTP transport is wrapped: every response body
is counted as it streams and refused one byte past the bound for the file asked for (the same bounds
the local readers hold: ``MAX_CONFIG_BYTES``, ``MAX_INDEX_BYTES``, ``MAX_HEADER_BYTES``) or once it has
taken ``BODY_SECONDS``; no single wait takes over ``WAIT_SECONDS``. The wrapping is scoped
(`bounded_client`) and restores the client factory the caller had; with a client that has no such
transport (another ``huggingface_hub`` major) it does nothing and the bounded readers still refuse
after the download.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fitcheck.errors import ModelSourceError

#: Seconds one response body may take; the client's own timeouts bound each read, not the whole body.
#: ``FITCHECK_HUB_BODY_SECONDS`` sets another (a slow mirror; the tests).
BODY_SECONDS = 60.0


#: Seconds one wait (connect, each read) may take: huggingface_hub's own default for HEAD and download
#: reads (``constants.DEFAULT_ETAG_TIMEOUT`` / ``DEFAULT_DOWNLOAD_TIMEOUT``), which a server that accepts
#: and never answers did not meet (it held ``estimate`` past 280 s); with the client's retries (6 tries,
#: 1-8 s apart) such a server is given up on after about 80 s.
WAIT_SECONDS = 10.0


def body_seconds() -> float:
    """`BODY_SECONDS`, or ``FITCHECK_HUB_BODY_SECONDS`` when it holds a positive number."""
    try:
        value = float(os.environ.get("FITCHECK_HUB_BODY_SECONDS", ""))
    except ValueError:
        return BODY_SECONDS
    return value if 0 < value < float("inf") else BODY_SECONDS


def body_limit(path: str) -> int:
    """The most bytes fitcheck reads of the Hub file at this URL path (the local readers' bounds)."""
    from fitcheck.sources.resolve import MAX_CONFIG_BYTES
    from fitcheck.sources.safetensors_header import MAX_HEADER_BYTES, MAX_INDEX_BYTES

    name = path.rsplit("/", 1)[-1]
    if name.endswith(".safetensors"):
        return MAX_HEADER_BYTES + 8  # the client reads the length prefix and the header, by range
    if name.endswith(".index.json"):
        return MAX_INDEX_BYTES
    return MAX_CONFIG_BYTES


class _Counted:
    """A response body that stops one byte past ``limit`` or after ``BODY_SECONDS``."""

    def __init__(self, inner: Any, limit: int, where: str) -> None:
        self.inner, self.limit, self.where = inner, limit, where
        self.seconds = body_seconds()
        self.deadline = time.monotonic() + self.seconds

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        for chunk in self.inner:
            seen += len(chunk)
            if seen > self.limit:
                raise ModelSourceError(
                    f"{self.where}: the Hub endpoint sent over {self.limit:,} bytes, too large for this file"
                )
            if time.monotonic() > self.deadline:
                raise ModelSourceError(
                    f"{self.where}: the Hub endpoint took over {self.seconds:g} s to send it (too slow)"
                )
            yield chunk

    def close(self) -> None:
        self.inner.close()


_TYPES: dict[type, type] = {}


def _counted_type(stream: object) -> type:
    """`_Counted` as a subclass of the HTTP library's own stream base, which its response asserts."""
    base = next((c for c in type(stream).__mro__ if c.__name__ == "SyncByteStream"), object)
    return _TYPES.setdefault(base, type("CountedStream", (_Counted, base), {}))


class _BoundedTransport:
    """The client's transport, with every response body `_Counted`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def handle_request(self, request: Any) -> Any:
        cap = min(WAIT_SECONDS, body_seconds())  # a server that accepts and never answers
        waits = dict(request.extensions.get("timeout") or {})
        request.extensions["timeout"] = {
            key: cap if waits.get(key) is None else min(waits[key], cap)
            for key in ("connect", "read", "write", "pool")
        }
        response = self.inner.handle_request(request)
        path = request.url.path
        name = path.rsplit("/", 1)[-1] or str(request.url)
        response.stream = _counted_type(response.stream)(response.stream, body_limit(path), name)
        return response

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> _BoundedTransport:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.__exit__(*exc)


@contextmanager
def bounded_client() -> Iterator[None]:
    """Inside the block, the ``huggingface_hub`` client's responses are bounded (module docstring)."""
    from huggingface_hub.utils import _http

    previous = getattr(_http, "_GLOBAL_CLIENT_FACTORY", None)
    if previous is None or not hasattr(_http, "set_client_factory"):
        yield
        return

    def factory() -> Any:
        client = previous()
        if hasattr(client, "_transport"):
            client._transport = _BoundedTransport(client._transport)
        return client

    _http.set_client_factory(factory)
    try:
        yield
    finally:
        _http.set_client_factory(previous)
