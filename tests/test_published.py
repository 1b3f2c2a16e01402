"""The engine against published measurements (tests/data/published/): schema, held scores, the bar.

The scores are recomputed here and must equal the committed ones (tests/data/published/scores.json) and
the generated section of docs/accuracy.md: a change to the engine or the corpus regenerates both with
``python bench/published.py --write-scores``. The acceptance bar of issue 10 is encoded record by record
and source by source; what fails it today is listed below as a known failure (strict xfail), so the suite is
green now and the lists can only shrink: a record that starts passing turns its xfail into a failure until
it is taken off the list.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from bench_helpers import bench_module

ROOT = Path(__file__).resolve().parent.parent


def _bench() -> ModuleType:
    return bench_module("published")


pub = _bench()
FILES = sorted(pub.DATA.glob("*.yaml"))

#: universal-llm-trainer's loop (no autocast, its own loss, torch AdamW) is posed as it runs; Phi-3 mini QLoRA
#: there still measures 19% above the estimate (fp32 stream; what holds the rest is not found in its code).
_ULT_PHI3_QLORA = (
    "Phi-3 mini QLoRA at 2 x 8192 without autocast: 19% under, cause not found. Session 9 ruled out a KV "
    "cache (init_model_config passes use_cache False under checkpointing), eager attention (posed eager the "
    "estimate is 3x the figure), held logits (config del_logits_after_forward True); the padded fp32 4-D "
    "mask SDPA gets (0.5 GiB) is too small. Every QLoRA row of the source is 2.3-4.1 GiB under, so the "
    "small model may only make a source-wide shortfall cross 15%. Session 10 (qloraall, "
    "bench/ult_qlora_replay.py): the step traced by emulation as the trainer runs it (fp32 load, 4-bit "
    "linears with a bf16 compute dtype, its own CE on the sliced logits) allocates what the engine does "
    "(14.89 against 14.91 GiB; Llama 3.1 8B and Llama 2 13B QLoRA within 0.3 GiB), so the layer, the fp32 "
    "stream, the dequantized weight and the loss are ruled out; replayed through bench/swift_loss.py's "
    "caching-allocator model it reserves 19.32 GiB (-8.0%; Llama 2 13B QLoRA -3.7%, the LoRA rows -3.9 to "
    "-9.3%): the loss's three 1.96 GiB fp32 logits blocks are cut beside the last layer's cached 1 GiB "
    "blocks. A candidate for the engine's flat 15% fragmentation (engine/overhead.py), not modelled and "
    "not checked on a GPU"
)
#: Records more than 15% under their measured figure today, with the reason (each one must be fixed, or its
#: record must name a setting the source leaves unstated, to leave this list).
#: The Qwen team's README profile (qwen-finetune-profiling.yaml), posed as finetune.py and its scripts run.
_QWEN_SHORT = (
    "Qwen-1 LoRA without DeepSpeed, bf16 under the Trainer's autocast: a shortfall of about 1.0-1.3 GiB "
    "(1.8B; 0.5-0.7 GiB on 7B) at 256-4096 tokens that the estimate passes at 8192; not found in "
    "finetune.py, modeling_qwen.py, peft 0.6.2, the Trainer or torch 2.0's AdamW (the LoRA (emb) rows' "
    "extra was torch 2.0's foreach denom, now posed); the figures' tool is not stated (what the yaml "
    "header rules out); not the scripts' per-GPU batch 2 either (session 9: at batch 2 the 1.8B rows "
    "would be 43% over at 4096 tokens and 90% at 8192); read as nvidia-smi (fitcheck's 0.39 GiB A100 "
    "context) they would be -9.2/-10.6%: the tool can account for the part beyond the bar, not the gap"
)
_QWEN_DS = (
    "Qwen-1 Q-LoRA under DeepSpeed ZeRO-2 on one GPU (posed as run: ds_config_zero2.json's "
    "reduce_bucket_size 2e8 and overlap_comm, no autocast, Qwen's own 16-bit loss; the step's flat gradient "
    "copies cached beside the activations' blocks, session 8): the 1.8B rows 0.9-1.0 GiB short at 256-1024 "
    "tokens, about the same 1.0 GiB as the 1.8B LoRA rows without DeepSpeed (_QWEN_SHORT), so more likely "
    "the model's or the reading's than DeepSpeed's; not found in DeepSpeed 0.12.3's stage_1_and_2.py, "
    "peft's prepare_model_for_kbit_training (leaves a GPTQ model's fp16 wte / lm_head in place) or "
    "auto-gptq's dequantizing forward (the yaml header, session 9); read as nvidia-smi they would be "
    "-10.1/-11.7/-10.6%, about 0.6 GiB still unexplained"
)
_THUDM_SFT = (
    "ChatGLM3-6B full fine-tuning, DeepSpeed ZeRO-3 on 4 GPUs in fp32 (finetune_hf.py casts every "
    "trainable parameter to fp32; ds_zero_3.json's bf16 'auto' follows the Trainer's flag, off): 7.2 GiB "
    "per GPU short of 48,346 MiB (15.3%, tool not stated) with the step's fp32 sub_group copy (3.7 GiB) "
    "cached beside the forward's blocks (session 8); ruled out in the record file (zero.Init in force, the "
    "16-bit consolidated save goes to the CPU, evaluation carries no labels, the init gradient buffer, the "
    "reuse walk's partial layer); the steps' lengths (AdvertiseGen, under the 385-token cap) are not "
    "published. Session 9 (glm3), a candidate not modelled: with overlap_comm the gathered fp32 parameters "
    "are cut on DeepSpeed's all-gather stream and freed with record_stream on the compute stream, and in "
    "forward the CPU waits only on its own all-gathers until loss.mean().item() (DeepSpeed v0.13.1 "
    "engine.py L1944), so a CPU k modules ahead of fp32 compute (no TF32) holds k modules' gathered "
    "parameters unreusable; 7.2 GiB is about 9 of 28 layers. It depends on CPU and GPU speed (GPU not "
    "stated), for which fitcheck has no setting; not measured (record file)"
)
#: Google Cloud's Vertex Model Garden OpenLLaMA-7B report (google-vertex-openllama-finetune.yaml, a held-out
#: source added in session 8, posed before it was scored): LoRA rows (fp16 model, no checkpointing) 2.5-3.5%
#: under, QLoRA rows 5.6-32.1% under, the gap growing with a step's tokens (b8 -> b32 the run adds 2.15 MB per
#: token, the estimate about 1.2 MB). The container's code as it ran is not published. The published image's
#: stack (bitsandbytes 0.39, torch 2.0.1, peft k-bit preparation: fp32 residual stream, reentrant
#: checkpointing, eager attention, fp16 autocast) was traced by emulation (bench/qlora2023_trace.py; a 4-bit
#: Linear with bitsandbytes 0.39's casts and kept input): at the 7B shape it grows 0.88 MB per token in
#: forward, 1.0 MB in backward, as the engine (0.86 / 1.1). 0.39's kept inputs are posed (bnb_keeps_input:
#: the recomputed layer's copies, 1-3 points); non-reentrant checkpointing would keep them in every layer
#: (3.2 MB per token, 61.9 GB at batch 32 against 39.38 measured). The missing ~1 MB per token is not any
#: mechanism of that stack the trace reproduces: unknown. Session 9: not the allocator (the traced 7B step
#: replayed through bench/swift_loss.py's allocator model, `qlora2023_trace.py --shape 7b --replay 3`,
#: reserves within 1.1 GB of the engine); the code is in no commit of vertex-ai-samples; the metric is open.
_GOOGLE_QLORA = (
    "OpenLLaMA-7B QLoRA on an A100 40G (Google Vertex Model Garden report, 2023): 19.8-32.1% under, "
    "growing with the step's tokens by about 1 MB per token; the published image's stack (bitsandbytes 0.39 "
    "keeping 4-bit inputs, reentrant checkpointing, peft's k-bit preparation with an fp32 residual stream, "
    "eager attention) traced by emulation grows as the engine does (bench/qlora2023_trace.py); the report's "
    "container code is unpublished (vertex-ai-samples has instruct_lora.py of 2023-08 and a 2024-10 "
    "rewrite only); ruled out in session 9, in the record file: the rewrite's defaults (double "
    "quantization, checkpointing off, bf16, an NVML reading in GiB), allocator fragmentation (the "
    "emulated 7B step replayed through an allocator model reserves at most 1.1 GB more than the engine), "
    "varying step lengths (the LoRA rows then 23-38% over): "
    "cause unknown"
)
_PEFT_ZERO3_OFFLOAD = (
    "bloomz-7b1 LoRA under DeepSpeed ZeRO-3 with offload_param and offload_optimizer cpu on one A100 (PEFT "
    "README, 2022-12, fp32, 8 x 64 tokens): 10.4 GiB estimated (allocated) against 18.1 GB, 39% under (61% "
    "before session 10 counted the GPU copies NoGatherHandle's .to(device) makes of offloaded partitions on "
    "one rank: engine/distributed.py _zero_grads). DeepSpeed v0.7.7, the release current at the run, had no "
    "NoGatherHandle (4d27225f, #2953, v0.9.0, 2023-04-07) and gathered on one rank as on many: "
    "all_gather_coalesced (partition_parameters.py @v0.7.7 L806-874) allocates each fetched module's "
    "full-size buffer on the GPU beside the GPU copy of its host partition (param.ds_tensor.to(cuda)): for "
    "the 1.03e9-element fp32 embedding 3.8 GiB more than the engine now counts, not posed (fitcheck has no "
    "DeepSpeed-release setting); with it the row would be about 16% under; the rest not found"
)
_SWIFT_OPENBUDDY_8192 = (
    "OpenBuddy-Zephyr-7B (Mistral shape, vocab 36,608) LoRA at max_length 8192, first scored in session 10 "
    "(config: configs/README.md): 26.4 GiB estimated (19.1 GiB allocated + 6.3 GiB allocator history over "
    "varying lengths) against 52.14 GiB, 49% under; the same model is 2.8-14.9% under at 512-4096 tokens. "
    "The measured row grows 28.9 GiB from 4096 to 8192 tokens, where the estimate grows 6.3 GiB. Posed "
    "with attn eager it would be +9.7% (and s4096 +13.3% over), a b x heads x s^2 growth, but swift "
    "registers openbuddy-zephyr-7b-chat with support_flash_attn=True (swift/llm/utils/model.py of the "
    "period, code-search file 5653080381) and use_flash_attn defaults true; flash attention keeps no s^2 "
    "tensor (with this config's sliding_window 4096 transformers' Mistral flash path passes flash-attn a "
    "window above 4096 tokens: the use_sliding_windows test as read in later releases, the 4.34-4.36 file "
    "itself not read), so eager is not what ran as far as read. A same-table sibling with the "
    "varying-lengths known_gap (Yi-6B-Chat: 26.7% under at 4096, 31.8% at 8192) shows a like unexplained "
    "jump. Cause not found"
)
_SWIFT_YI34_8192 = (
    "Yi-34B-Chat LoRA at max_length 8192 on two A100s by device_map (first scored in session 10; config is "
    "Yi-34B's, same shape: configs/README.md): 53.8 GiB on the bottleneck GPU (41.5 GiB allocated + 10.7 GiB "
    "allocator history over varying lengths) against 65.03 GiB, 17.3% under; the 512-4096 rows on one GPU "
    "are within 1.3%. As the same table's qwen-7b-chat-full-s8192-2gpu (known_gap: the 8192-token run's "
    "history beyond fitcheck's ladder) and Yi-6B-Chat's 8192 row (31.8% under), the part beyond the "
    "ladder's history is not modelled; not verified for this model. Cause not found"
)
_LITGPT_STABLELM_FULL = (
    "stablelm-base-alpha-3b full fine-tuning, litgpt FSDP as printed on 4xA10G (first scored in session 10; "
    "config: configs/README.md): 18.2 GB allocated at the backward peak against 21.23 GB, 17.6% under. "
    "Ruled out by posing: the config file's devices: 2 (litgpt "
    "config_hub/finetune/stablelm-base-alpha-3b/full.yaml, max_seq_length 512, micro_batch_size 1, "
    "bf16-true) gives 54% over; FSDP1 instead of FSDP2 changes "
    "nothing (-17.6%); the siblings posed alike are -2.0% (gemma-2b) and +12.0% (phi-2). Cause not found"
)
KNOWN_UNDER: dict[str, str] = {
    **{f"google-vertex-openllama-finetune/qlora-{k}": _GOOGLE_QLORA for k in ("b16", "b24", "b32", "s2048")},
    **{
        f"qwen-finetune-profiling/qwen-{k}": _QWEN_SHORT
        for k in (
            "1.8b-lora-s256",
            "1.8b-lora-s512",
        )
    },
    **{f"qwen-finetune-profiling/qwen-1.8b-qlora-s{n}": _QWEN_DS for n in (256, 512, 1024)},
    "universal-llm-trainer/phi-3-mini-qlora-h100": _ULT_PHI3_QLORA,
    "universal-llm-trainer/phi-3-mini-qlora-rtx-pro-6000": _ULT_PHI3_QLORA,
    "universal-llm-trainer/phi-3-mini-qlora-a100": _ULT_PHI3_QLORA,
    "thudm-chatglm3-finetune/chatglm3-6b-sft-zero3-4gpu": _THUDM_SFT,
    "peft-readme-memory/bloomz-7b1-lora-zero3-offload": _PEFT_ZERO3_OFFLOAD,
    "ms-swift/openbuddy-zephyr-7b-chat-lora-s8192": _SWIFT_OPENBUDDY_8192,
    "ms-swift/yi-34b-chat-lora-s8192-2gpu": _SWIFT_YI34_8192,
    "litgpt-config-hub/stablelm-3b-full-4gpu": _LITGPT_STABLELM_FULL,
}
#: Sources whose median |error| is above 10% today.
KNOWN_SOURCE: dict[str, str] = {
    "thudm-chatglm3-finetune": "15.3% median of three records: LoRA on one GPU +0.8%, the ZeRO-3 full "
    "fine-tuning on 4 GPUs 15.3% under (_THUDM_SFT), P-Tuning v2 57% over (posed at its 769-token cap)",
    "peft-readme-memory": "95.1% median of eight records: the six T0_3B / mt0-xxl rows posed at the "
    "encoder's 512-token truncation cap (the tweets' padded lengths are not printed) are 26-165% "
    "over; posed at 48-128 tokens (not stated) the single-GPU LoRA rows are within 11%, "
    "full fine-tuning 18% over and the ZeRO-3 CPU-offload rows 15-57% under, as "
    "bloomz-7b1's ZeRO-3-offload row is at its stated 64 tokens (_PEFT_ZERO3_OFFLOAD); "
    "the six seq2seq rows name the unstated length in known_gap; bloomz-7b1 LoRA without "
    "DeepSpeed +4.2%",
}


@cache
def _scored() -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    return pub.score_all()  # type: ignore[no-any-return]


def _all_scores() -> list[Any]:
    return [s for sc in _scored()[0].values() for s in sc]


# --- schema ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_source_block(path: Path) -> None:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert set(data) <= {"source", "defaults", "records"}
    src = data["source"]
    for key in pub.SOURCE_KEYS:
        assert src.get(key), f"{path.name}: source.{key} missing"
    assert src["id"] == path.stem
    assert str(src["url"]).startswith("https://")
    assert re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", str(src["date"]))
    if "commit" in src:
        assert re.fullmatch(r"[0-9a-f]{40}", src["commit"]) and src["commit"] in src["url"]


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_records_schema(path: Path) -> None:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    defaults = data.get("defaults") or {}
    ids = [r["id"] for r in data["records"]]
    assert len(ids) == len(set(ids)), f"{path.name}: duplicate record ids"
    for raw in data["records"]:
        assert set(raw) <= set(pub.RECORD_KEYS), (
            f"{raw['id']}: unknown keys {set(raw) - set(pub.RECORD_KEYS)}"
        )
        assert raw.get("model", defaults.get("model")), f"{raw['id']}: no model"
        assert raw.get("metric", defaults.get("metric")) in pub.METRICS, f"{raw['id']}: metric"
        assert raw.get("relation", defaults.get("relation", "peak")) in pub.RELATIONS
        m = raw["measured"]
        assert m["unit"] in pub.UNITS and float(m["value"]) > 0, f"{raw['id']}: measured"
        setup = {
            **{k: v for k, v in defaults.items() if k not in pub.RECORD_KEYS},
            **(raw.get("setup") or {}),
        }
        assert setup.get("method"), f"{raw['id']}: setup.method"
        for u in [*(defaults.get("uncertain") or []), *(raw.get("uncertain") or [])]:
            assert isinstance(u, str) and u
        if raw.get("known_gap") is not None:
            assert isinstance(raw["known_gap"], str) and raw["known_gap"]


def test_corpus_size_and_independence() -> None:
    records = [r for _, recs in pub.corpus().values() for r in recs]
    single = [r for r in records if r.gpus == 1]
    publishers = {src["publisher"].split(" (")[0] for src, _ in pub.corpus().values()}
    assert len(single) >= 80
    assert len(publishers) >= 8, publishers
    assert len({r.key for r in records}) == len(records)


def test_units() -> None:
    assert pub.measured_bytes(1.5, "GB", "peak") == 1_500_000_000
    assert pub.measured_bytes(24, "GB", "capacity") == 24 << 30
    assert pub.measured_bytes(2, "MiB", "peak") == 2 << 20


# --- held scores -----------------------------------------------------------------------------------


def test_scores_match_committed() -> None:
    committed = json.loads(pub.SCORES.read_text(encoding="utf-8"))
    now = pub.scores_json(_scored()[0])
    assert now["records"].keys() == committed["records"].keys(), "scored records changed: --write-scores"
    drift = {
        k: (committed["records"][k], v)
        for k, v in now["records"].items()
        if abs(v - committed["records"][k]) > 1e-4
    }
    assert not drift, f"scores moved (run python bench/published.py --write-scores): {drift}"
    assert now["sources"] == committed["sources"]
    for key in ("band_spread", "band_held_out", "band_stability", "band_above_high"):
        assert now[key] == committed[key], f"{key} moved (run python bench/published.py --write-scores)"


def test_docs_section_is_generated() -> None:
    doc = pub.DOC.read_text(encoding="utf-8")
    assert pub.BEGIN in doc and pub.END in doc
    assert pub.splice(doc, pub.render(*_scored())) == doc, "docs/accuracy.md stale: python bench/published.py"


def test_band_table_is_the_derived_one() -> None:
    """engine/band.py holds the fractions bench/published.py derives from calibration and corpus."""
    from fitcheck.engine.band import FIXED, SPREAD

    derived = pub.derive_spread(_scored()[0])
    held = {**{k: tuple(v) for k, v in SPREAD.items()}, "fixed": tuple(float(b) for b in FIXED)}
    assert held == derived, f"update SPREAD / FIXED in engine/band.py: {derived}"
    assert pub.band_coverage(_scored()[0], derived) >= 0.8


def test_band_holds_on_sources_it_was_not_fitted_to() -> None:
    """Leave-one-source-out: the band derived without a source, on that source's records (no known gap),
    is exceeded by no more than the 10% its 90% coverage promises (docs/accuracy.md, "Held out")."""
    ho = pub.bd.held_out(pub.band_evidence(_scored()[0]))
    above, n = sum(h.above for h in ho.values()), sum(h.n for h in ho.values())
    # exactly the allowed share passes: (1 - 0.9) * 290 is 28.999999999999996 in floating point
    assert above <= (1 - pub.bd.COVERAGE) * n + 1e-9, f"{above} of {n} held-out records above high_bytes"


#: Why the band's stability does not hold (docs/methodology.md, "The band"): one source decides a term.
#: Session 10 (sequential fractions, each source one voice, at 92.5%, the rule the held-out records chose):
#: leaving one source out moves a record's low edge by up to 7.3% of its estimate and its high edge by up to
#: 31.3% (without PEFT's README table; docs/accuracy.md's rules table). Session 9 (joint fit at 92.5%):
#: 4.4% / 14.3%; session 8 (sequential fractions at 90%): 17.3% / 8.8%; session 7 (fixed term first):
#: 26.1% / 8.1%.
UNSTABLE = (
    "one source decides a term (session 10: low edge 7.3%, high edge 31.3% of an estimate when one source "
    "is left out; session 9: 4.4% and 14.3%; session 8: 17.3% and 8.8%); docs/methodology.md, 'The band'"
)


@pytest.mark.xfail(strict=True, reason=UNSTABLE)
def test_band_is_stable_leaving_one_source_out() -> None:
    """No source decides the band: leaving any one out moves neither edge of any scored record by more
    than STABILITY_BOUND of its estimate (docs/methodology.md, "The band", argues the bound)."""
    moves = pub.bd.stability(pub.band_evidence(_scored()[0]))
    for side, mv in moves.items():
        assert mv.share <= pub.bd.STABILITY_BOUND, f"{side} edge: {mv}"


def test_band_rule_is_the_one_the_held_out_records_choose() -> None:
    """SPREAD and FIXED hold the candidate rule, at the lowest fit level (bench/band_derive.py
    ``FIT_COVERAGES``) where some candidate keeps the held-out promise, that leaves the fewest held-out
    records above the high edge (narrowest among equals; ``choose``); every lower level breaks the
    promise for every candidate, and no candidate at the chosen level misses fewer."""
    rows, states = pub.band_rows(_scored()[0]), pub.states_spread()
    clean = sum(1 for r in rows if not r.known_gap)
    allowed = (1 - pub.bd.COVERAGE) * clean + 1e-9
    chosen = pub.chosen_rule(_scored()[0])

    def misses_at(cover: float) -> dict[str, int]:
        return {n: pub.bd.held_out_misses(rows, states, pub.bd.at(r, cover)) for n, r in pub.bd.CANDIDATES}

    for cover in pub.bd.FIT_COVERAGES:
        if cover == chosen.cover:
            break
        assert min(misses_at(cover).values()) > allowed, cover
    misses = misses_at(chosen.cover)
    assert misses[chosen.name] == chosen.misses == min(misses.values()), misses
    ties = [n for n, r in pub.bd.CANDIDATES if misses[n] == misses[chosen.name]]
    widths = {
        n: pub.bd.mean_high(rows, pub.bd.at(r, chosen.cover)(rows, states))
        for n, r in pub.bd.CANDIDATES
        if n in ties
    }
    assert widths[chosen.name] == min(widths.values()), widths
    assert chosen.misses <= allowed, (misses, clean)


def test_every_skip_has_a_reason() -> None:
    for recs in _scored()[1].values():
        for rec, why in recs:
            assert why and rec.key


def test_enough_scored() -> None:
    assert len(_all_scores()) >= 80


# --- the bar ---------------------------------------------------------------------------------------


def _record_cases() -> list[Any]:
    out = []
    for s in sorted(_all_scores(), key=lambda x: x.record.key):
        key = s.record.key
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_UNDER[key])] if key in KNOWN_UNDER else []
        out.append(pytest.param(s, id=key, marks=marks))
    return out


@pytest.mark.parametrize("score", _record_cases())
def test_record_not_more_than_15_percent_under(score: Any) -> None:
    if score.record.known_gap:
        return  # the record names why the engine cannot be held to it
    assert score.error >= pub.UNDER_BAR, f"{score.record.key}: {score.error:+.1%}"


def _source_cases() -> list[Any]:
    out = []
    for sid in sorted(_scored()[0]):
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_SOURCE[sid])] if sid in KNOWN_SOURCE else []
        out.append(pytest.param(sid, id=sid, marks=marks))
    return out


@pytest.mark.parametrize("sid", _source_cases())
def test_source_median_within_10_percent(sid: str) -> None:
    med = pub.Summary.of(_scored()[0][sid]).median_abs
    assert med <= pub.MEDIAN_BAR, f"{sid}: median |error| {med:.1%}"


def test_known_lists_name_real_records() -> None:
    keys = {s.record.key for s in _all_scores()}
    assert set(KNOWN_UNDER) <= keys
    assert set(KNOWN_SOURCE) <= set(_scored()[0])


def test_model_configs_resolve_offline_and_are_sourced() -> None:
    """Every config folder is read by fitcheck's resolver and has its row (where it was read) in the
    folder's README."""
    from fitcheck.sources.resolve import resolve_model

    readme = (pub.CONFIGS / "README.md").read_text(encoding="utf-8")
    folders = sorted(p.parent for p in pub.CONFIGS.glob("*/*/config.json"))
    assert folders
    for folder in folders:
        name = f"{folder.parent.name}/{folder.name}"
        assert f"| {name} |" in readme, f"{name}: no source row in configs/README.md"
        assert resolve_model(str(folder)).source_kind == "hf_config"
        assert not isinstance(pub._spec(name), str)


def test_multi_gpu_records_are_posed_per_gpu() -> None:
    """Records with several GPUs are estimated through the distributed setup, as the source states it
    (world size, strategy, offload); their bar is the corpus bar above (it replaced the 15% median / 25%
    under bar of the former tests/test_published_multigpu.py; multigpu_peft.yaml's runs are posed as they
    ran, with a bf16 stream, and its CPU-offload row is in KNOWN_UNDER)."""
    multi = [s for s in _all_scores() if s.record.gpus > 1]
    assert len(multi) >= 30
    for s in multi:
        d = s.estimate.distributed
        assert d is not None, s.record.key
        assert d.gpus_per_node * d.nodes == s.record.gpus
        assert d.strategy == pub._STRATEGIES[s.record.setup["strategy"]]
        assert d.offload == pub._OFFLOAD[str(s.record.setup.get("offload", "none"))]
    peft = [s for s in multi if s.record.source == "multigpu_peft"]
    assert len(peft) == 3 and all(s.estimate.regime.kbit_upcast is False for s in peft)
