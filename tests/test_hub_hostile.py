"""The real ``huggingface_hub`` client against a hostile Hub endpoint (HF_ENDPOINT): one clear line, exit 2.

Each case was a failure before session 5's fix (red-team pass 2), unless marked as held already:

- a redirect loop or a body cut short reached the user as the HTTP library's exception (internal error);
- a 1 GB ``config.json`` (and one whose HEAD says 100 bytes) was written whole to the cache before the
  bounded reader refused it; a server sending a byte every 2 s never ended (`sources.hub_bounds`);
- an index naming shards outside the repo (``../``) or thousands of shards had the client fetch each one
  (``get_safetensors_metadata``); it is now held to the local index's rules first (`index_shards`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from test_hub import COMMIT, TINY, FakeHub, Handler, run_cli

CONFIG = json.dumps(TINY).encode()
GIB = 1 << 30


class Hostile(Handler):
    """``acme/<kind>``: each kind misbehaves in its own way; anything else is the honest FakeHub."""

    def _send(self, status: int, length: int | None, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", '"e"')
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def _stream(self, total: int) -> None:
        chunk = b" " * (1 << 20)
        try:
            for _ in range(total // len(chunk)):
                self.wfile.write(chunk)
                self.server.sent += len(chunk)  # type: ignore[attr-defined]
        except OSError:
            pass

    def _route(self, head: bool) -> None:
        parts = self.path.split("?")[0].lstrip("/").split("/")
        kind, fname = parts[1], "/".join(parts[4:])
        if kind == "e500":
            return self._error(500, "")
        if kind == "hang":  # accepts, never answers (the handler thread ends with the test's server)
            time.sleep(120)
            return None
        if kind == "loop":
            return self._send(302, 0, {"Location": self.path})
        if fname != "config.json" or kind not in ("huge", "liar", "trunc", "slow", "html"):
            return super()._route(head)
        if kind in ("huge", "liar"):
            self._send(200, GIB if kind == "huge" else (100 if head else None))  # liar: HEAD says 100
            return None if head else self._stream(GIB)
        body = b"<html>not a config</html>" if kind == "html" else CONFIG
        self._send(200, len(body), {"Content-Type": "text/html"} if kind == "html" else None)
        if head:
            return None
        if kind == "trunc":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            return self.connection.close()
        for byte in body if kind == "slow" else [body]:
            try:
                self.wfile.write(bytes([byte]) if isinstance(byte, int) else byte)
                self.wfile.flush()
            except OSError:
                return None
            if kind == "slow":
                time.sleep(1)
        return None


class HostileHub(FakeHub):
    def __init__(self) -> None:
        super(FakeHub, self).__init__(("127.0.0.1", 0), Hostile)
        self.repos, self.gated, self.log, self.sent = {}, {}, [], 0


@pytest.fixture
def hostile() -> Iterator[HostileHub]:
    import threading

    server = HostileHub()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tensors = ["model.embed_tokens.weight", "lm_head.weight"]
    server.repos["acme/dotdot"] = _index({t: f"../model-{i}.safetensors" for i, t in enumerate(tensors)})
    server.repos["acme/slash"] = _index({t: f"sub/model-{i}.safetensors" for i, t in enumerate(tensors)})
    server.repos["acme/many"] = _index({f"t{i}": f"model-{i:05d}.safetensors" for i in range(5000)})
    server.repos["acme/gated"] = {"config.json": CONFIG}
    server.gated["acme/gated"] = "hf_secret"
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _index(weight_map: dict[str, str]) -> dict[str, bytes]:
    return {
        "config.json": CONFIG,
        "model.safetensors.index.json": json.dumps({"weight_map": weight_map}).encode(),
    }


#: (repo kind, a word of the one error line)
CASES = [
    ("gated", "gated"),  # held already: 401 with the Hub's error code
    ("nothing", "no Hub repo"),  # held already: 404
    ("loop", "redirects"),
    ("trunc", "peer closed"),
    ("huge", "over 4,000,000 bytes"),
    ("liar", "over 4,000,000 bytes"),
    ("slow", "too slow"),
    ("html", "not valid JSON"),  # held already: a body of the wrong type meets the JSON reader
    ("dotdot", "outside its folder"),
    ("slash", "outside its folder"),
    ("many", "5,000 shards"),
]


@pytest.mark.parametrize(("kind", "word"), CASES, ids=[c[0] for c in CASES])
def test_a_hostile_hub_endpoint_is_one_clear_line(
    hostile: HostileHub, tmp_path: Path, kind: str, word: str
) -> None:
    env = {"HF_ENDPOINT": hostile.url, "HF_HOME": str(tmp_path), "FITCHECK_HUB_BODY_SECONDS": "3"}
    started = time.monotonic()
    proc = run_cli(["estimate", f"acme/{kind}", "--on", "none"], env)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("fitcheck: error:")]
    assert proc.returncode == 2, proc.stderr
    assert len(errors) == 1 and word in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert hostile.sent <= 16 << 20, f"read {hostile.sent:,} bytes of a file it refuses past 4 MB"
    assert time.monotonic() - started < 60


@pytest.mark.slow  # the client retries a 500 with backoff (about 25 s)
def test_a_server_error_is_one_clear_line(hostile: HostileHub, tmp_path: Path) -> None:
    proc = run_cli(
        ["estimate", "acme/e500", "--on", "none"], {"HF_ENDPOINT": hostile.url, "HF_HOME": str(tmp_path)}
    )
    assert proc.returncode == 2 and proc.stderr.count("fitcheck: error:") == 1, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow  # the client's 6 tries with 1-8 s between them (about 45 s with 3 s waits)
def test_a_server_that_never_answers_is_given_up_on(hostile: HostileHub, tmp_path: Path) -> None:
    """It held ``estimate`` past 280 s before each wait was capped (`hub_bounds.WAIT_SECONDS`)."""
    env = {"HF_ENDPOINT": hostile.url, "HF_HOME": str(tmp_path), "FITCHECK_HUB_BODY_SECONDS": "3"}
    started = time.monotonic()
    proc = run_cli(["estimate", "acme/hang", "--on", "none"], env)
    assert proc.returncode == 2 and proc.stderr.count("fitcheck: error:") == 1, proc.stderr
    assert "cannot reach" in proc.stderr and time.monotonic() - started < 100
