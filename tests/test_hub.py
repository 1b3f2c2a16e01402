"""Hub ids: presets by hf_id offline, the HF cache offline, and the real huggingface_hub client against a
local HTTP server standing in for the Hub (HF_ENDPOINT). Nothing here touches the network.

The client reads HF_ENDPOINT / HF_HUB_OFFLINE / HF_HOME when it is imported, so every case runs the CLI
in a subprocess with its own environment.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fitcheck.sources.hub import parse_hub_id

SRC = str(Path(__file__).resolve().parents[1] / "src")
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "tie_word_embeddings": False,
}


def _tiny_tensors() -> dict[str, tuple[str, list[int]]]:
    h, i, v, kv = 64, 96, 256, 32
    out: dict[str, tuple[str, list[int]]] = {"model.embed_tokens.weight": ("BF16", [v, h]),
                                             "lm_head.weight": ("BF16", [v, h]),
                                             "model.norm.weight": ("F32", [h])}  # fmt: skip
    for n in range(2):
        p = f"model.layers.{n}."
        out |= {
            p + "self_attn.q_proj.weight": ("BF16", [h, h]),
            p + "self_attn.k_proj.weight": ("BF16", [kv, h]),
            p + "self_attn.v_proj.weight": ("BF16", [kv, h]),
            p + "self_attn.o_proj.weight": ("BF16", [h, h]),
            p + "mlp.gate_proj.weight": ("BF16", [i, h]),
            p + "mlp.up_proj.weight": ("BF16", [i, h]),
            p + "mlp.down_proj.weight": ("BF16", [h, i]),
            p + "input_layernorm.weight": ("F32", [h]),
            p + "post_attention_layernorm.weight": ("F32", [h]),
        }
    return out


def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    """A safetensors file: 8-byte header length, JSON header, then (zeroed) data."""
    size = {"BF16": 2, "F32": 4, "U8": 1}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * off


EXPECTED_TOTAL = 2 * 256 * 64 + 64 + 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 96 + 2 * 64)


class FakeHub(ThreadingHTTPServer):
    """Serves ``/{repo}/resolve/{revision}/{path}`` as the Hub does: HEAD and GET with Range, the
    X-Repo-Commit / ETag headers the client needs, X-Error-Code on 404 and gated repos."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.repos: dict[str, dict[str, bytes]] = {}
        self.gated: dict[str, str] = {}  # repo -> token that opens it
        self.answers: dict[str, int] = {}  # repo -> an HTTP error status every request gets
        self.log: list[tuple[str, str, str | None]] = []  # (method, path, range header)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: FakeHub

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _route(self, head: bool) -> None:
        self.server.log.append((self.command, self.path, self.headers.get("Range")))
        parts = self.path.split("?")[0].lstrip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            return self._error(404, "RepoNotFound")
        repo, rev, fname = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        answers = getattr(self.server, "answers", {})  # (test_hub_hostile's server has none)
        if repo in answers:  # a bare status, no X-Error-Code (a server error, a proxy)
            return self._error(answers[repo], "")
        if repo not in self.server.repos:
            return self._error(404, "RepoNotFound")
        token = self.server.gated.get(repo)
        if token and self.headers.get("Authorization") != f"Bearer {token}":
            return self._error(401, "GatedRepo")
        if rev not in ("main", COMMIT):
            return self._error(404, "RevisionNotFound")
        body = self.server.repos[repo].get(fname)
        if body is None:
            return self._error(404, "EntryNotFound")
        status, chunk = 200, body
        rng = self.headers.get("Range")
        if rng:
            start, _, end = rng.removeprefix("bytes=").partition("-")
            chunk = body[int(start) : (int(end) + 1 if end else len(body))]
            status = 206
        self.send_response(status)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", '"' + hashlib.sha1(body).hexdigest() + '"')
        self.send_header("Content-Length", str(len(body) if head else len(chunk)))
        self.end_headers()
        if not head:
            self.wfile.write(chunk)

    def _error(self, code: int, kind: str) -> None:
        self.send_response(code)
        if kind:
            self.send_header("X-Error-Code", kind)
            self.send_header("X-Error-Message", kind)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    server = FakeHub()
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    base["PYTHONPATH"] = SRC + os.pathsep + base.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "fitcheck", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, "HF_HUB_DISABLE_TELEMETRY": "1", **env},
    )


def _estimate(model: str, env: dict[str, str]) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    proc = run_cli(["estimate", model, "--on", "none", "--method", "full", "--format", "json"], env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc


def test_parse_hub_id() -> None:
    assert parse_hub_id("meta-llama/Llama-3.1-8B") == ("meta-llama/Llama-3.1-8B", None)
    assert parse_hub_id("org/name@v1.0") == ("org/name", "v1.0")
    assert parse_hub_id("org/name@refs/pr/1") == ("org/name", "refs/pr/1")
    for not_hub in ("./x/y", "/abs/path", "a/b/c", "org/config.json", "7B", "a/../b"):
        assert parse_hub_id(not_hub) is None, not_hub


@pytest.mark.parametrize(
    ("hub_id", "preset"),
    [("meta-llama/Llama-3.1-8B", "llama-3.1-8b"), ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
     ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"), ("qwen/qwen2.5-7b", "qwen2.5-7b")],
)  # fmt: skip
def test_preset_hub_ids_resolve_offline_without_the_client(hub_id: str, preset: str, tmp_path: Path) -> None:
    code = (
        "import sys; from fitcheck.cli import main\n"
        f"try: main(['estimate', {hub_id!r}, '--on', 'none', '--format', 'json'])\n"
        "except SystemExit as e: assert not e.code, e.code\n"
        "sys.stderr.write(repr(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'huggingface_hub', 'torch', 'transformers', 'numpy'})))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().endswith("[]")
    assert json.loads(proc.stdout)["model"] == preset


def _cache_repo(cache: Path, repo: str, files: dict[str, bytes]) -> None:
    """The huggingface_hub cache layout: models--org--name/{refs/main, snapshots/<commit>/...}."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    for name, data in files.items():
        path = root / "snapshots" / COMMIT / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def test_cached_config_resolves_offline_with_counts_from_the_config(tmp_path: Path) -> None:
    _cache_repo(tmp_path / "hub", "acme/tiny-llama", {"config.json": json.dumps(TINY).encode()})
    out, proc = _estimate("acme/tiny-llama", {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)})
    assert out["model_source"] == "hf_config"
    assert out["params"]["total"] == EXPECTED_TOTAL
    assert "fetching" not in proc.stderr  # offline: no progress line, nothing fetched


def test_hf_hub_cache_variable_is_honoured(tmp_path: Path) -> None:
    _cache_repo(tmp_path / "elsewhere", "acme/tiny-llama", {"config.json": json.dumps(TINY).encode()})
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "home"),
        "HF_HUB_CACHE": str(tmp_path / "elsewhere"),
    }
    out, _ = _estimate("acme/tiny-llama", env)
    assert out["params"]["total"] == EXPECTED_TOTAL


def test_cached_safetensors_give_header_counts_offline(tmp_path: Path) -> None:
    files = {
        "config.json": json.dumps(TINY).encode(),
        "model.safetensors": safetensors_bytes(_tiny_tensors()),
    }
    _cache_repo(tmp_path / "hub", "acme/tiny-llama", files)
    out, _ = _estimate("acme/tiny-llama", {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)})
    assert out["model_source"] == "safetensors"


def test_offline_and_not_cached_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = run_cli(
        ["estimate", "acme/absent", "--on", "none"], {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "HF_HUB_OFFLINE" in lines[0] and "hf download acme/absent" in lines[0]
    assert "Traceback" not in proc.stderr


def _env(hub: FakeHub, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path), **extra}


def test_local_endpoint_single_file_headers_only(hub: FakeHub, tmp_path: Path) -> None:
    st = safetensors_bytes(_tiny_tensors())
    hub.repos["acme/tiny-llama"] = {"config.json": json.dumps(TINY).encode(), "model.safetensors": st}
    out, proc = _estimate("acme/tiny-llama", _env(hub, tmp_path))
    assert out["model_source"] == "safetensors"
    assert out["params"]["total"] == EXPECTED_TOTAL
    assert "fetching acme/tiny-llama from http://127.0.0.1" in proc.stderr
    weights = [r for r in hub.log if r[0] == "GET" and r[1].endswith(".safetensors")]
    assert weights and all(rng is not None for _, _, rng in weights), "safetensors bodies must be ranged"
    header_len = struct.unpack("<Q", st[:8])[0]
    assert all(int(rng.split("-")[-1]) < 8 + header_len + 100_001 for _, _, rng in weights if rng)


def test_local_endpoint_sharded_index_and_revision(hub: FakeHub, tmp_path: Path) -> None:
    tensors = _tiny_tensors()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2 :]}  # fmt: skip
    files = {"config.json": json.dumps(TINY).encode()}
    weight_map = {}
    for fname, keys in shards.items():
        files[fname] = safetensors_bytes({k: tensors[k] for k in keys})
        weight_map |= {k: fname for k in keys}
    files["model.safetensors.index.json"] = json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
    hub.repos["acme/sharded"] = files
    out, _ = _estimate(f"acme/sharded@{COMMIT}", _env(hub, tmp_path))
    assert out["model_source"] == "safetensors"
    assert out["model"] == f"acme/sharded@{COMMIT}"
    assert any(COMMIT in path for _, path, _ in hub.log)
    proc = run_cli(["estimate", "acme/sharded@nope", "--on", "none"], _env(hub, tmp_path))
    assert proc.returncode == 2 and "no revision 'nope'" in proc.stderr


def test_local_endpoint_config_only_repo_counts_from_config(hub: FakeHub, tmp_path: Path) -> None:
    hub.repos["acme/bin-only"] = {"config.json": json.dumps(TINY).encode(), "pytorch_model.bin": b"x"}
    out, _ = _estimate("acme/bin-only", _env(hub, tmp_path))
    assert out["model_source"] == "hf_config"
    assert out["params"]["total"] == EXPECTED_TOTAL
    assert not any(path.endswith(".bin") for _, path, _ in hub.log)


def test_gated_repo_needs_hf_token(hub: FakeHub, tmp_path: Path) -> None:
    hub.repos["acme/gated"] = {"config.json": json.dumps(TINY).encode()}
    hub.gated["acme/gated"] = "hf_secret"
    proc = run_cli(["estimate", "acme/gated", "--on", "none"], _env(hub, tmp_path))
    assert proc.returncode == 2 and "gated" in proc.stderr and "HF_TOKEN" in proc.stderr
    out, _ = _estimate("acme/gated", _env(hub, tmp_path, HF_TOKEN="hf_secret"))
    assert out["params"]["total"] == EXPECTED_TOTAL


def test_unknown_repo_is_exit_2(hub: FakeHub, tmp_path: Path) -> None:
    proc = run_cli(["estimate", "acme/nothing-here", "--on", "none"], _env(hub, tmp_path))
    assert proc.returncode == 2 and "no Hub repo 'acme/nothing-here'" in proc.stderr


@pytest.mark.parametrize(
    ("status", "words"),
    [(401, "needs a token: set HF_TOKEN (or run hf auth login)"), (403, "denies access: set HF_TOKEN")],
)
def test_token_statuses_are_one_line_naming_the_token(
    hub: FakeHub, tmp_path: Path, status: int, words: str
) -> None:
    hub.answers["acme/private"] = status
    proc = run_cli(["estimate", "acme/private", "--on", "none"], _env(hub, tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"fitcheck: error: the Hub answered {status} for 'acme/private': it {words}")


@pytest.mark.slow  # the client retries a server error with backoff (about 25 s)
def test_a_server_error_says_try_again_later(hub: FakeHub, tmp_path: Path) -> None:
    hub.answers["acme/busy"] = 500
    proc = run_cli(["estimate", "acme/busy", "--on", "none"], _env(hub, tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "fitcheck: error: the Hub answered 500 for 'acme/busy' (a server error): try again later"
    )


def test_the_status_is_read_through_the_cause_chain() -> None:
    """huggingface_hub hides a 5xx answer to its metadata request behind LocalEntryNotFoundError (the
    response is on the cause); no response anywhere is no status (the network: another message)."""
    from fitcheck.sources.hub import FetchFailed, _refused, http_status

    class Answer(Exception):
        def __init__(self, status: int) -> None:
            super().__init__(f"{status}")
            self.response = type("R", (), {"status_code": status})()

    try:
        try:
            raise Answer(503)
        except Answer as inner:
            raise OSError("cannot find the requested files in the local cache") from inner
    except OSError as outer:
        assert http_status(outer) == 503
        with pytest.raises(FetchFailed, match=r"answered 503 for 'a/b' \(a server error\): try again later"):
            _refused("a/b", outer)
    assert http_status(OSError("network down")) is None
    _refused("a/b", OSError("network down"))  # no status: the caller's own message


def test_unsupported_type_without_torch_names_the_extra(hub: FakeHub, tmp_path: Path) -> None:
    hub.repos["acme/ssm"] = {"config.json": json.dumps({**TINY, "model_type": "mamba"}).encode()}
    proc = run_cli(["estimate", "acme/ssm", "--on", "none"], _env(hub, tmp_path))
    assert proc.returncode == 2 and "state-space" in proc.stderr


def test_local_endpoint_diffusers_pipeline(hub: FakeHub, tmp_path: Path) -> None:
    """A diffusers repo: model_index.json, then each component's config.json, then the folder reader."""
    from test_diffusion_sources import write_folder

    folder = write_folder(tmp_path / "snap", "sd15")
    hub.repos["acme/tiny-sd"] = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*.json")}
    proc = run_cli(
        ["estimate", "acme/tiny-sd", "--on", "none", "--format", "json"], _env(hub, tmp_path / "hf")
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["model"] == "acme/tiny-sd" and doc["model_source"] == "diffusers_folder"
    assert not any("tokenizer" in path or "scheduler" in path for _, path, _ in hub.log)


@pytest.mark.slow  # the client retries a refused connection with backoff (about 25 s)
def test_unreachable_endpoint_is_one_line(tmp_path: Path) -> None:
    proc = run_cli(
        ["estimate", "acme/tiny", "--on", "none"],
        {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path)},
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 2  # the progress line and the error
    assert "cannot reach http://127.0.0.1:9" in proc.stderr and "Traceback" not in proc.stderr


def _lying(size_claim: int) -> bytes:
    """A safetensors file whose one tensor's shape needs 32 bytes but whose data_offsets say otherwise."""
    raw = json.dumps({"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, size_claim]}}).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * size_claim


#: (files of a hostile repo on the local endpoint, a word the one error line has): the real client reads
#: them; fitcheck holds them to the rules a local file meets (red-team pass, session 4).
HOSTILE_REPOS: list[tuple[dict[str, bytes], str]] = [
    ({"config.json": json.dumps(TINY).encode(), "model.safetensors": _lying(8)}, "lies"),
    ({"config.json": json.dumps(TINY).encode(), "model.safetensors": _lying(10**6)}, "lies"),
    (
        {
            "config.json": json.dumps(TINY).encode(),
            "model.safetensors": safetensors_bytes({"w": ("BF16", [4, 4])}).replace(b'"BF16"', b'"Q9_K"'),
        },
        "Q9_K",
    ),
    ({"config.json": json.dumps({**TINY, "model_type": "\x1b[2Jllama"}).encode()}, "\\x1b[2Jllama"),
    ({"config.json": ("[" * 5000 + "]" * 5000).encode()}, "nested"),
    ({"config.json": json.dumps({**TINY, "hidden_size": 10**12}).encode()}, "hidden_size"),
]


@pytest.mark.parametrize(
    ("files", "word"), HOSTILE_REPOS, ids=[f"hostile-{i}" for i in range(len(HOSTILE_REPOS))]
)
def test_a_hostile_repo_is_one_inert_line(
    hub: FakeHub, tmp_path: Path, files: dict[str, bytes], word: str
) -> None:
    hub.repos["acme/hostile"] = files
    proc = run_cli(["estimate", "acme/hostile", "--on", "none"], _env(hub, tmp_path))
    errors = [line for line in proc.stderr.splitlines() if line.startswith("fitcheck: error:")]
    assert proc.returncode == 2, proc.stderr
    assert len(errors) == 1 and word in errors[0], proc.stderr
    assert "\x1b" not in proc.stderr and "Traceback" not in proc.stderr
