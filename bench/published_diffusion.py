"""Score fitcheck's diffusion estimate against the published diffusion measurements
(tests/data/published/diffusion/*.yaml; schema: tests/data/published/README.md, and the file's header).

    PYTHONPATH=src python bench/published_diffusion.py          # the table, per record
    PYTHONPATH=src python bench/published_diffusion.py --write  # and regenerate docs/diffusion.md's section

Each record is posed through `fitcheck.api.estimate` with the setup keys fitcheck has (`SETUP_KEYS`) and the
posing keys below, and compared as fitcheck's device figure (peak reserved + CUDA context: what nvidia-smi
shows) against the printed value, ``GB`` read as 10^9 B:

- ``text_encoder: freed``: the training script caches the text encoder's outputs and deletes the encoder
  before training (ShivamShrirao's train_dreambooth.py ``--cache_latents``); kohya's SD 1.x script has no
  such option (fitcheck refuses ``--cache-text-encoder-outputs`` there), so the part is dropped from the spec.
- ``text_tokens``: the padded prompt length, when the source states it.
- ``gpu: unknown``: no target (no CUDA context of a card is added).
- ``metric: max_memory_allocated`` (the record's or the file's ``defaults``): the source printed
  ``torch.cuda.max_memory_allocated()`` (PEFT's TorchTracemalloc), so fitcheck's peak allocated bytes are
  compared, not the device figure; the likely range is moved down by the same difference (device -
  allocated: the allocator's reserve and the CUDA context, which that counter does not see).
- ``train_text_encoder``, ``lora_rank``: handed to fitcheck as they are (``SETUP_KEYS``).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from band_derive import Row
from published import UNITS

if TYPE_CHECKING:
    from fitcheck.models import Estimate

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "published" / "diffusion"
DOC = ROOT / "docs" / "diffusion.md"
BEGIN = "<!-- published-diffusion:begin (bench/published_diffusion.py --write) -->"
END = "<!-- published-diffusion:end -->"
#: setup keys handed to fitcheck as they are
SETUP_KEYS = (
    "method", "precision", "optimizer", "grad_ckpt", "attn", "resolution", "cache_latents", "grad_accum",
    "batch_size", "train_text_encoder", "lora_rank", "keep_grads",
)  # fmt: skip
#: what the printed figure measured: the device figure (nvidia-smi, or unstated) unless the source read
#: torch.cuda.max_memory_allocated
ALLOCATED = "max_memory_allocated"


@dataclass(frozen=True)
class Record:
    source: str
    id: str
    model: str
    setup: dict[str, Any]
    gpu: str | None
    measured_bytes: float
    known_gap: str | None
    metric: str = "unknown"


@dataclass(frozen=True)
class Score:
    record: Record
    device_bytes: int  # the figure compared: the device figure, or peak allocated (``metric``)
    low_bytes: int
    high_bytes: int
    error: float  # (device - measured) / measured
    kinds: dict[str, int]  # bytes of each band kind inside the figure compared (engine/band.py kind_bytes)


def records() -> list[Record]:
    out = []
    for path in sorted(DATA.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        defaults = doc.get("defaults", {})
        for r in doc["records"]:
            keys = (*SETUP_KEYS, "text_encoder", "text_tokens")
            setup = {**{k: v for k, v in defaults.items() if k in keys}, **r["setup"]}
            m = r["measured"]
            out.append(
                Record(
                    source=doc["source"]["id"],
                    id=r["id"],
                    model=r.get("model", defaults.get("model")),
                    setup=setup,
                    gpu=r.get("gpu", defaults.get("gpu")),
                    measured_bytes=float(m["value"]) * UNITS[m["unit"]],
                    known_gap=r.get("known_gap"),
                    metric=r.get("metric", defaults.get("metric", "unknown")),
                )
            )
    return out


def _pose(rec: Record) -> Estimate:
    """fitcheck's estimate of the record's run, posed as the module doc says."""
    from fitcheck import api

    spec = api.resolve(rec.model)
    if rec.setup.get("text_encoder") == "freed":
        spec = spec.model_copy(update={"parts": tuple(p for p in spec.parts if p.role != "text_encoder")})
    if rec.setup.get("text_tokens"):
        spec = spec.model_copy(update={"text_tokens": int(rec.setup["text_tokens"])})
    opts = {k: rec.setup[k] for k in SETUP_KEYS if k in rec.setup}
    on = rec.gpu if rec.gpu and rec.gpu != "unknown" else None
    return api.estimate(spec, on=on, **opts)


def _unseen(rec: Record, est: Estimate) -> int:
    """Bytes of the device figure the record's counter does not see (reserve and context, for
    ``max_memory_allocated``)."""
    return est.device_bytes - est.peak_allocated_bytes if rec.metric == ALLOCATED else 0


def score(rec: Record) -> Score:
    from fitcheck.engine.band import kind_bytes

    est = _pose(rec)
    band = est.band
    low, high = (band.low_bytes, band.high_bytes) if band else (est.device_bytes, est.device_bytes)
    cut = _unseen(rec, est)
    figure = est.device_bytes - cut
    err = (figure - rec.measured_bytes) / rec.measured_bytes
    kinds = kind_bytes(est.phase(est.peak_phase), est.allocator_reserve_bytes, est.context_bytes)
    kinds["transient"] -= cut
    return Score(rec, figure, low - cut, high - cut, err, kinds)


def band_rows(scores: list[Score] | None = None) -> list[Row]:
    """Every record as the band's derivation sees it (bench/band_derive.py ``Row``), from its score (scored
    here when not given). The diffusion records are derived from with the LLM corpus' (bench/published.py
    ``band_rows``), so the band the diffusion estimator shares answers for them."""
    return [
        Row(
            source=s.record.source,
            key=f"{s.record.source}/{s.record.id}",
            known_gap=bool(s.record.known_gap),
            measured=round(s.record.measured_bytes),
            estimate=s.device_bytes,
            kinds=s.kinds,
        )
        for s in (scores if scores is not None else [score(r) for r in records()])
    ]


def table(scores: list[Score]) -> str:
    rows = [
        "| record | measured | fitcheck (device) | error | likely range | inside | known gap |",
        "|---|---:|---:|---:|---|---|---|",
    ]
    for s in scores:
        inside = "yes" if s.low_bytes <= s.record.measured_bytes <= s.high_bytes else "no"
        alloc = " (allocated)" if s.record.metric == ALLOCATED else ""
        gap = "yes" if s.record.known_gap else ""
        rows.append(
            f"| {s.record.source}/{s.record.id} | {s.record.measured_bytes / 1e9:.2f} GB | "
            f"{s.device_bytes / 1e9:.2f} GB{alloc} | {s.error:+.1%} | "
            f"{s.low_bytes / 1e9:.2f}-{s.high_bytes / 1e9:.2f} GB | {inside} | {gap} |"
        )
    return "\n".join(rows)


def section(scores: list[Score]) -> str:
    held = [s for s in scores if not s.record.known_gap]
    errs = [abs(s.error) for s in held]
    median = statistics.median(errs)
    inside = sum(s.low_bytes <= s.record.measured_bytes <= s.high_bytes for s in held)
    lines = [
        BEGIN,
        f"{len(scores)} records, {len(held)} without a known gap: median |error| {median:.1%}, "
        f"largest {max(errs):.1%}; {inside} of {len(held)} inside their likely range.",
        "",
        table(scores),
    ]
    if any(s.record.metric == ALLOCATED for s in scores):
        lines += [
            "",
            "(allocated): fitcheck's peak allocated bytes, where the source printed "
            "torch.cuda.max_memory_allocated().",
        ]
    lines.append(END)
    return "\n".join(lines)


def write_doc(text: str) -> None:
    doc = DOC.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    DOC.write_text(pattern.sub(lambda _: text, doc), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="regenerate docs/diffusion.md's section")
    a = ap.parse_args(argv)
    scores = [score(r) for r in records()]
    text = section(scores)
    print(text)
    if a.write:
        write_doc(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
