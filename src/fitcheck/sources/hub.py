"""Hugging Face Hub ids (``org/name``, ``org/name@revision``) -> a model spec, through ``huggingface_hub``.

What is read: ``config.json`` (or ``model_index.json`` and each component's ``config.json`` for a
diffusers pipeline) through the client's cache, and the safetensors *headers* through the client's
range requests (``get_safetensors_metadata``: the first bytes of each shard, sharded indexes
included), never the weights. Offline (``HF_HUB_OFFLINE=1``) only the cache is read; safetensors
headers then come from cached shards when there are any, else the counts come from the config.

The client honours ``HF_TOKEN`` (gated repos), ``HF_HOME`` / ``HF_HUB_CACHE`` (the cache) and
``HF_ENDPOINT`` (a mirror, or the test server) itself. ``huggingface_hub`` is imported here only, when a
Hub id is resolved, so ``fitcheck --help`` and preset estimates stay import-light.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fitcheck.errors import InputError, ModelSourceError, NotFoundError
from fitcheck.models import ModelSpec
from fitcheck.terminal import printable

if TYPE_CHECKING:
    from fitcheck.diffusion.spec import DiffusionSpec

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
HUB_ID = re.compile(rf"^(?P<repo>{_NAME}/{_NAME})(?:@(?P<rev>[A-Za-z0-9][A-Za-z0-9._/-]*))?$")


def parse_hub_id(text: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision)`` when ``text`` reads as a Hub id, else None (the Hub's own rules are checked
    by `spec_from_hub`, the one path that asks the Hub)."""
    m = HUB_ID.match(text.strip())
    if m is None or text.endswith((".json", ".safetensors")) or ".." in text:
        return None
    return m["repo"], m["rev"]


def _progress(repo: str, rev: str | None, endpoint: str) -> None:
    where = f"{repo}@{rev}" if rev else repo
    print(
        f"fitcheck: fetching {printable(where)} from {endpoint} (config and safetensors headers) ...",
        file=sys.stderr,
    )


def _fix_offline(repo: str, filename: str = "config.json") -> str:
    return (
        f"'{repo}' is not in the Hugging Face cache and HF_HUB_OFFLINE is set: go online (unset "
        f"HF_HUB_OFFLINE), or download its config first: hf download {repo} {filename}"
    )


def _download(hf: Any, repo: str, filename: str, rev: str | None) -> Path | None:
    """A file of the repo through the client (cache first); None when the repo has no such file.

    Raises:
        ModelSourceError / NotFoundError: gated, missing, offline-and-uncached, or network trouble.
    """
    from huggingface_hub import errors as e

    try:
        return Path(hf.hf_hub_download(repo, filename, revision=rev))
    except e.GatedRepoError:
        raise ModelSourceError(
            f"'{repo}' is gated: accept its license on the model page and set HF_TOKEN (or run hf auth login)"
        ) from None
    except e.RepositoryNotFoundError:
        raise NotFoundError(
            f"no Hub repo '{repo}' (or it is private: set HF_TOKEN); a preset id from `fitcheck models` "
            "or a local folder also work"
        ) from None
    except e.RevisionNotFoundError:
        raise NotFoundError(f"'{repo}' has no revision '{rev}'") from None
    except e.LocalEntryNotFoundError as exc:
        if hf.constants.HF_HUB_OFFLINE:
            raise ModelSourceError(_fix_offline(repo, filename)) from None
        _refused(repo, exc)
        raise FetchFailed(
            f"cannot reach {hf.constants.ENDPOINT} to fetch '{repo}' and it is not cached: check the "
            "network (or HF_ENDPOINT), or set HF_HUB_OFFLINE=1 with the config in the cache"
        ) from None
    except e.EntryNotFoundError:
        return None
    except (e.HfHubHTTPError, OSError) as exc:
        _refused(repo, exc)
        raise FetchFailed(f"fetching '{repo}' failed: {_first_line(exc)}") from None
    except http_errors() as exc:
        raise FetchFailed(f"fetching '{repo}' failed: {_first_line(exc)}") from None


class FetchFailed(ModelSourceError):
    """The endpoint could not be reached or answered with an HTTP error (not: the file is bad)."""


#: What to do about an HTTP status the Hub answered (huggingface_hub raises a plain ``HfHubHTTPError`` for
#: a 401/403 without its ``X-Error-Code``, and, after its retries, hides a 5xx answer to the metadata
#: request behind ``LocalEntryNotFoundError``, whose cause holds the response).
TOKEN_HINT = "set HF_TOKEN (or run hf auth login)"
STATUS_HINTS: dict[int, str] = {
    401: f"needs a token: {TOKEN_HINT}",
    403: f"denies access: {TOKEN_HINT} with a token that can read it (a gated repo: accept its license "
    "on the model page)",
}


def http_status(exc: BaseException | None) -> int | None:
    """The HTTP status of the first response in the exception's cause chain, if one is there."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", None)
        if isinstance(status, int):
            return status
        exc = exc.__cause__ or exc.__context__
    return None


def _refused(repo: str, exc: BaseException) -> None:
    """Raise `FetchFailed` in one line when the Hub answered 401, 403 or a server error."""
    status = http_status(exc)
    if status in STATUS_HINTS:
        raise FetchFailed(f"the Hub answered {status} for '{repo}': it {STATUS_HINTS[status]}") from None
    if status is not None and status >= 500:
        raise FetchFailed(
            f"the Hub answered {status} for '{repo}' (a server error): try again later"
        ) from None


def http_errors() -> tuple[type[Exception], ...]:
    """The HTTP library's own error bases, for whichever library the client runs on (already imported).

    A redirect loop (``TooManyRedirects``) or a body cut short (``RemoteProtocolError``) reaches fitcheck
    as the library's exception, not the client's ``HfHubHTTPError``.
    """
    names = (("httpx2", "HTTPError"), ("httpx2", "StreamError"), ("httpx", "HTTPError"),
             ("httpx", "StreamError"), ("requests", "RequestException"))  # fmt: skip
    found = (getattr(sys.modules.get(module), name, None) for module, name in names)
    return tuple(cls for cls in found if isinstance(cls, type) and issubclass(cls, Exception))


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def _remote_shards(hf: Any, repo: str, rev: str | None) -> list[str]:
    """The safetensors files of a Hub repo: ``model.safetensors``, or the shards its index names (held
    to the local index's rules, `index_shards`, before the client fetches any); [] when it has neither."""
    from fitcheck.fileio import read_json
    from fitcheck.sources.safetensors_header import MAX_INDEX_BYTES, index_shards

    if hf.file_exists(repo, "model.safetensors", revision=rev):
        return ["model.safetensors"]
    index = _download(hf, repo, "model.safetensors.index.json", rev)
    if index is None:
        return []
    where = f"{repo}/model.safetensors.index.json"
    return index_shards(read_json(index, MAX_INDEX_BYTES, "safetensors index"), where)


def _remote_tensors(hf: Any, repo: str, rev: str | None) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) from the safetensors headers on the Hub (range requests only).

    A malformed or hostile index or header is an error (one line); a network failure is not: headers
    are a refinement, and the config alone still sizes the model.
    """
    from huggingface_hub import errors as e

    from fitcheck.sources.safetensors_header import tensors

    quiet = (e.EntryNotFoundError, e.SafetensorsParsingError, e.HfHubHTTPError, OSError, FetchFailed)
    try:
        names = _remote_shards(hf, repo, rev)
        files = {name: hf.parse_safetensors_file_metadata(repo, name, revision=rev) for name in names}
    except quiet:
        return {}
    except http_errors():
        return {}
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for fname, fm in files.items():  # checked as a local header is (dtype, shape, offsets)
        header = {
            name: {"dtype": info.dtype, "shape": list(info.shape), "data_offsets": list(info.data_offsets)}
            for name, info in fm.tensors.items()
        }
        out.update(tensors(header, f"{repo}/{fname}"))
    return out


def _cached_tensors(hf: Any, repo: str, rev: str | None) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Safetensors headers of shards already in the cache (offline); empty when they are not all there."""
    from fitcheck.sources.safetensors_header import read_all

    for name in ("model.safetensors.index.json", "model.safetensors"):
        hit = hf.try_to_load_from_cache(repo, name, revision=rev)
        if isinstance(hit, str):
            try:
                return read_all(Path(hit))
            except ModelSourceError:
                return {}  # an index whose shards are not all cached
    return {}


def spec_from_hub(repo: str, rev: str | None = None) -> ModelSpec | DiffusionSpec:
    """Resolve a Hub repo: a transformers model (config.json) or a diffusers pipeline (model_index.json)."""
    try:
        import huggingface_hub as hf
    except ImportError:  # a core dependency; only a broken install lacks it
        raise ModelSourceError(
            "huggingface_hub is missing: pip install huggingface_hub (a fitcheck dependency)"
        ) from None
    from huggingface_hub.utils import HFValidationError, disable_progress_bars, logging, validate_repo_id

    from fitcheck.sources.hub_bounds import bounded_client

    try:  # the client's own rules ('--', '..', a name over 96 characters, '.git'), before any request
        validate_repo_id(repo)
    except HFValidationError as exc:
        raise InputError(f"'{printable(repo[:100])}' is not a Hub id: {_first_line(exc)}") from None
    disable_progress_bars()
    logging.set_verbosity_error()  # the client's retry warnings would break the one-line contract
    with bounded_client():
        return _resolve(hf, repo, rev)


def _resolve(hf: Any, repo: str, rev: str | None) -> ModelSpec | DiffusionSpec:
    from fitcheck.sources.resolve import read_config_noting, spec_from_config

    offline = bool(hf.constants.HF_HUB_OFFLINE)
    if not offline:
        _progress(repo, rev, hf.constants.ENDPOINT)
    index_only = _cached_pipeline(hf, repo, rev) if offline else None
    if index_only is not None:
        return _diffusers(hf, repo, rev, index_only)
    cfg_path = _download(hf, repo, "config.json", rev)
    where = f"{repo}@{rev}" if rev else repo
    if cfg_path is None:
        index = _download(hf, repo, "model_index.json", rev)
        if index is None:
            raise ModelSourceError(f"'{where}' has neither config.json nor model_index.json")
        return _diffusers(hf, repo, rev, index)
    cfg, warnings = read_config_noting(cfg_path)
    tensors = _cached_tensors(hf, repo, rev) if offline else _remote_tensors(hf, repo, rev)
    return spec_from_config(cfg, id=where, name=repo, source=f"hf://{where}/config.json", tensors=tensors,
                            hf_id=repo, warnings=warnings)  # fmt: skip


def _cached_pipeline(hf: Any, repo: str, rev: str | None) -> Path | None:
    """Offline: the cached ``model_index.json`` of a diffusers pipeline whose repo has no cached
    ``config.json`` (a pipeline has none at its root, so asking the client for it offline fails as "not
    in the cache" however complete the cache is); None otherwise."""
    if isinstance(hf.try_to_load_from_cache(repo, "config.json", revision=rev), str):
        return None
    index = hf.try_to_load_from_cache(repo, "model_index.json", revision=rev)
    return Path(index) if isinstance(index, str) else None


def _diffusers(hf: Any, repo: str, rev: str | None, index_path: Path) -> DiffusionSpec:
    """A diffusers pipeline: each component's config.json into the cache, then the folder reader."""
    from fitcheck.diffusion.sources import SKIP, spec_from_folder
    from fitcheck.sources.resolve import read_config

    index = read_config(index_path)
    for name, value in index.items():
        if name.startswith("_") or name in SKIP or not isinstance(value, list) or len(value) < 2:
            continue
        if value[1] is None:
            continue
        _download(hf, repo, f"{name}/config.json", rev)
    spec = spec_from_folder(index_path.parent)
    return spec.model_copy(update={"id": f"{repo}@{rev}" if rev else repo, "hf_id": repo})
