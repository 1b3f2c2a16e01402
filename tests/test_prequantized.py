"""Pre-quantized checkpoints (a config.json with ``quantization_config``): what is read, how LoRA on them is
sized, what is refused, and the safetensors cross-check over packed weights (src/fitcheck/sources/prequant.py;
fixtures and their sources: tests/data/prequant/README.md)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest

from fitcheck import api
from fitcheck.engine.params import count_params
from fitcheck.errors import FitcheckError, ModelSourceError, OptionError
from fitcheck.sources.prequant import read_prequant
from fitcheck.sources.resolve import CT_NOTE, FP8_NOTE, MXFP4_NOTE, spec_from_path
from test_hub import TINY, _cache_repo, run_cli

DATA = Path(__file__).parent / "data" / "prequant"
BNB4 = DATA / "unsloth" / "llama-3-8b-Instruct-bnb-4bit"
GPTQ = DATA / "gptqmodel-issue" / "qwen3-30b-a3b-gptq-4bit"
AWQ = DATA / "constructed" / "llama-3-8b-awq"
OSS = Path(__file__).parent / "data" / "arch" / "openai" / "gpt-oss-20b"


def _cfg(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return data


def _unquantized(tmp_path: Path, folder: Path) -> Path:
    """The same config without its quantization_config: the 16-bit release of the same model."""
    cfg = {k: v for k, v in _cfg(folder).items() if k != "quantization_config"}
    out = tmp_path / folder.name
    out.mkdir()
    (out / "config.json").write_text(json.dumps(cfg))
    return out


# --- what is read --------------------------------------------------------------------------------------


def test_fixtures_read_as_their_schemes() -> None:
    bnb = read_prequant(_cfg(BNB4))
    assert bnb is not None and (bnb.scheme, bnb.method, bnb.base_quant) == ("bnb-4bit", "qlora", "none")
    assert (bnb.double_quant, bnb.quant_storage, bnb.dequantized) == (True, "uint8", False)
    gptq = read_prequant(_cfg(GPTQ))
    assert gptq is not None and (gptq.scheme, gptq.method, gptq.base_quant) == ("gptq", "lora", "gptq")
    awq = read_prequant(_cfg(AWQ))
    assert awq is not None and (awq.scheme, awq.base_quant) == ("awq", "awq")
    oss = read_prequant(_cfg(OSS))
    assert oss is not None and oss.scheme == "mxfp4" and oss.dequantized
    assert read_prequant(TINY) is None


def test_bitsandbytes_defaults_follow_bitsandbytesconfig() -> None:
    """A bare ``load_in_4bit`` (no quant_method: pre-2023 configs) is bitsandbytes FP4 without double
    quantization, uint8 storage: BitsAndBytesConfig's defaults."""
    pq = read_prequant({"quantization_config": {"load_in_4bit": True}})
    assert pq is not None and pq.scheme == "bnb-4bit" and "FP4" in pq.read
    assert (pq.double_quant, pq.quant_storage) == (False, "uint8")
    eight = read_prequant({"quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}})
    assert eight is not None and (eight.scheme, eight.base_quant) == ("bnb-8bit", "int8")
    gptq8 = read_prequant({"quantization_config": {"quant_method": "gptq", "bits": 8, "group_size": 128}})
    assert gptq8 is not None and gptq8.base_quant == "gptq-int8"


@pytest.mark.parametrize(
    ("q", "words"),
    [
        ("nf4", "must be a JSON object"),
        ({"bits": 4}, "no quant_method"),
        ({"quant_method": "bitsandbytes"}, "exactly one of load_in_4bit"),
        ({"load_in_4bit": True, "load_in_8bit": True}, "exactly one of load_in_4bit"),
        ({"load_in_4bit": "yes"}, "must be true or false"),
        ({"load_in_4bit": True, "bnb_4bit_quant_type": "int4"}, "nf4 or fp4"),
        ({"load_in_4bit": True, "bnb_4bit_quant_storage": "int16"}, "bnb_4bit_quant_storage"),
        ({"load_in_8bit": True, "llm_int8_has_fp16_weight": True}, "llm_int8_has_fp16_weight"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 0}, "group_size must be a positive number"),
        ({"quant_method": "gptq", "bits": 4, "group_size": -2}, "or -1 (got -2)"),
        ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "3 bits"),
        ({"quant_method": "gptq", "bits": "4"}, "must be an integer"),
        ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "Marlin"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "AWQ 'gemv'"),
        ({"quant_method": "awq", "bits": 4, "q_group_size": 0}, "q_group_size must be a positive"),
        ({"quant_method": "fbgemm_fp8"}, "'fbgemm_fp8': transformers cannot fine-tune it"),
        ({"quant_method": "hqq"}, "not modelled"),
        ({"quant_method": 5}, "quant_method must be a string"),
        ({"quant_method": "\x1b[31mevil" + "x" * 500}, "\\x1b[31mevil"),
        ({"quant_method": "awq", "version": "v" * 5000}, "AWQ 'vvvv"),
        ({"quant_method": "gptq", "bits": 4, "modules_to_not_convert": "lm_head"}, "list of module names"),
        ({"quant_method": "gptq", "bits": 4, "modules_to_not_convert": ["a,b"]}, "holding a comma"),
        ({"load_in_4bit": True, "llm_int8_skip_modules": ["x"] * 5000}, "at most 4096 module names"),
        ({"load_in_4bit": True, "llm_int8_skip_modules": ["y" * 600]}, "at most 512"),
    ],
)
def test_malformed_or_unmodelled_configs_are_refused(q: object, words: str) -> None:
    with pytest.raises(ModelSourceError, match=None) as err:
        read_prequant({"quantization_config": q})
    line = str(err.value)
    assert words in line and "\n" not in line and "\x1b" not in line and len(line) < 400


# --- estimates ---------------------------------------------------------------------------------------


def test_lora_on_a_bnb_4bit_checkpoint_is_sized_as_qlora_with_its_settings(tmp_path: Path) -> None:
    """LoRA on unsloth's bnb-4bit Llama 3 8B is QLoRA: the same bytes as --method qlora on the 16-bit
    release with the checkpoint's double quantization and uint8 storage, well under 16-bit LoRA."""
    est = api.estimate(str(BNB4), on="a100-80gb", method="lora", seq_len=1024)
    assert (est.setup.method, est.setup.double_quant, est.setup.quant_storage) == ("qlora", True, "uint8")
    plain = _unquantized(tmp_path, BNB4)
    same = api.estimate(str(plain), on="a100-80gb", method="qlora", seq_len=1024, quant_storage="uint8")
    assert est.device_bytes == same.device_bytes
    sixteen = api.estimate(str(plain), on="a100-80gb", method="lora", seq_len=1024)
    assert est.device_bytes < sixteen.device_bytes - 8 * 2**30  # 16 GB of bf16 weights vs about 5
    assert any("pre-quantized checkpoint (bitsandbytes 4-bit NF4" in w for w in est.warnings)


def test_double_quantization_off_in_the_checkpoint_is_kept(tmp_path: Path) -> None:
    cfg = _cfg(BNB4)
    cfg["quantization_config"] = {**cfg["quantization_config"], "bnb_4bit_use_double_quant": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    est = api.estimate(str(tmp_path), on="a100-80gb", seq_len=512)
    assert (est.setup.method, est.setup.double_quant) == ("qlora", False)


@pytest.mark.parametrize(("folder", "base"), [(GPTQ, "gptq"), (AWQ, "awq")])
def test_lora_on_gptq_and_awq_checkpoints_is_sized_on_their_packed_base(
    tmp_path: Path, folder: Path, base: str
) -> None:
    est = api.estimate(str(folder), on="h100-80gb", method="lora", seq_len=512, lora_targets="attn")
    assert (est.setup.method, est.setup.base_quant) == ("lora", base)
    plain = _unquantized(tmp_path, folder)
    same = api.estimate(str(plain), on="h100-80gb", seq_len=512, lora_targets="attn", base_quant=base)  # type: ignore[arg-type]
    assert est.device_bytes == same.device_bytes
    assert any(f"sized as --base-quant {base}" in w for w in est.warnings)


def test_mxfp4_and_fp8_checkpoints_are_sized_dequantized(tmp_path: Path) -> None:
    """transformers trains neither form as stored (is_trainable False): both load dequantized to bf16, so
    full fine-tuning is sized like the 16-bit release, with the note."""
    est = api.estimate(str(OSS), on="none", method="lora", seq_len=256, lora_targets="attn")
    assert est.setup.method == "lora" and est.setup.base_quant == "none" and MXFP4_NOTE in est.warnings
    cfg = {**TINY, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    fp8 = api.estimate(str(tmp_path), on="none", method="full", seq_len=64)
    assert FP8_NOTE in fp8.warnings
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps(TINY))
    assert fp8.device_bytes == api.estimate(str(plain), on="none", method="full", seq_len=64).device_bytes


def test_compressed_tensors_checkpoint_is_sized_decompressed() -> None:
    """RedHatAI's FP8-dynamic Llama 4 Scout (compressed-tensors): trained decompressed, so even full
    fine-tuning is sized (transformers' Trainer accepts a model whose quantizer is QAT-trainable)."""
    folder = (
        Path(__file__).parent / "data" / "arch" / "RedHatAI" / "Llama-4-Scout-17B-16E-Instruct-FP8-dynamic"
    )
    est = api.estimate(str(folder), on="none", method="full", seq_len=128)
    assert est.setup.method == "full" and CT_NOTE in est.warnings


def test_plan_keeps_to_lora_on_the_stored_base() -> None:
    plan = api.plan(str(BNB4), on="rtx-4090")
    assert plan.estimate is not None and plan.estimate.setup.method == "qlora"


# --- refusals ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("folder", "flags", "words"),
    [
        (BNB4, ["--method", "full"], "refuses to fine-tune a quantized model without adapters"),
        (GPTQ, ["--method", "full"], "refuses to fine-tune a quantized model without adapters"),
        (GPTQ, ["--method", "qlora"], "--method qlora quantizes a 16-bit base to NF4"),
        (BNB4, ["--base-quant", "int8"], "--base-quant int8 contradicts it"),
        (AWQ, ["--base-quant", "gptq"], "--base-quant gptq contradicts it"),
        (BNB4, ["--quant-storage", "bf16"], "--quant-storage bf16 contradicts it"),
        (BNB4, ["--no-double-quant"], "--no-double-quant contradicts it"),
        (BNB4, ["--trainer", "torchtune"], "--trainer torchtune does not load its quantized layers"),
        (AWQ, ["--trainer", "unsloth"], "--trainer unsloth does not load its quantized layers"),
        (BNB4, ["--method", "prefix-tuning", "--prefix-tokens", "8"], "prefix-tuning on a quantized base"),
    ],
)
def test_conflicting_flags_are_one_line_exit_2(folder: Path, flags: list[str], words: str) -> None:
    proc = run_cli(["estimate", str(folder), "--on", "a100-80gb", *flags], {"HF_HUB_OFFLINE": "1"})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr
    assert (
        lines[0].startswith("fitcheck: error:")
        and "pre-quantized checkpoint" in lines[0]
        and words in lines[0]
    )


def test_gptq_on_a_cpu_target_names_the_checkpoint_not_a_flag() -> None:
    with pytest.raises(OptionError, match="its kernels need CUDA") as err:
        api.estimate(str(GPTQ), on="cpu", seq_len=128)
    assert "--base-quant" not in str(err.value)  # the user gave no such flag


def test_unmodelled_scheme_refused_at_resolution_exit_2(tmp_path: Path) -> None:
    cfg = {**TINY, "quantization_config": {"quant_method": "hqq", "nbits": 4}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FitcheckError, match="'hqq': its layout is not modelled"):
        api.estimate(str(tmp_path), on="none")
    proc = run_cli(["estimate", str(tmp_path), "--on", "none"], {"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


# --- safetensors cross-check over packed weights -------------------------------------------------------

_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1, "I8": 1, "I32": 4, "F8_E4M3": 1}


def _safetensors(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, (dtype, shape) in tensors.items():
        n = _SIZE[dtype] * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * off


def _linears() -> dict[str, tuple[int, int]]:
    """TINY's projections per layer: name -> (out, in)."""
    h, i, kv = 64, 96, 32
    return {"self_attn.q_proj": (h, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
            "self_attn.o_proj": (h, h), "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h),
            "mlp.down_proj": (h, i)}  # fmt: skip


def _packed(out: int, inp: int, scheme: str) -> dict[str, tuple[str, list[int]]]:
    """One projection as each writer stores it (tensor names and shapes: bitsandbytes ``Params4bit`` with
    its ``QuantState``, AutoGPTQ ``QuantLinear``, AutoAWQ ``WQLinear_GEMM``, LLM.int8, fine-grained FP8)."""
    n, groups = out * inp, -(-inp // 128)
    if scheme == "bnb-4bit":
        blocks = -(-n // 64)
        return {".weight": ("U8", [(n + 1) // 2, 1]), ".weight.absmax": ("U8", [blocks]),
                ".weight.quant_map": ("F32", [16]), ".weight.nested_absmax": ("F32", [-(-blocks // 256)]),
                ".weight.nested_quant_map": ("F32", [256]),
                ".weight.quant_state.bitsandbytes__nf4": ("U8", [120])}  # fmt: skip
    if scheme == "gptq":
        return {".qweight": ("I32", [inp // 8, out]), ".qzeros": ("I32", [groups, out // 8]),
                ".scales": ("F16", [groups, out]), ".g_idx": ("I32", [inp])}  # fmt: skip
    if scheme == "awq":
        return {".qweight": ("I32", [inp, out // 8]), ".qzeros": ("I32", [groups, out // 8]),
                ".scales": ("F16", [groups, out])}  # fmt: skip
    if scheme == "compressed-tensors":  # llm-compressor's pack-quantized W4A16
        return {".weight_packed": ("I32", [out, inp // 8]), ".weight_scale": ("F16", [out, groups]),
                ".weight_zero_point": ("I32", [out // 8, groups]), ".weight_shape": ("I32", [2])}  # fmt: skip
    if scheme == "bnb-8bit":
        return {".weight": ("I8", [out, inp]), ".SCB": ("F32", [out]), ".weight_format": ("U8", [1])}
    return {".weight": ("F8_E4M3", [out, inp]), ".weight_scale_inv": ("F32", [-(-out // 128), groups])}


QUANT = {
    "bnb-4bit": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                 "quant_method": "bitsandbytes"},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True},
    "bnb-8bit": {"load_in_8bit": True, "quant_method": "bitsandbytes"},
    "fp8": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    "compressed-tensors": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                           "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 128}}}},
}  # fmt: skip


def _checkpoint(scheme: str) -> dict[str, tuple[str, list[int]]]:
    h, v = 64, 256
    out: dict[str, tuple[str, list[int]]] = {
        "model.embed_tokens.weight": ("BF16", [v, h]), "lm_head.weight": ("BF16", [v, h]),
        "model.norm.weight": ("BF16", [h]),
    }  # fmt: skip
    for layer in range(2):
        p = f"model.layers.{layer}."
        out[p + "input_layernorm.weight"] = ("BF16", [h])
        out[p + "post_attention_layernorm.weight"] = ("BF16", [h])
        for name, (o, i) in _linears().items():
            out.update({p + name + tail: t for tail, t in _packed(o, i, scheme).items()})
    return out


@pytest.mark.parametrize("scheme", list(QUANT))
def test_headers_of_packed_checkpoints_count_the_model(tmp_path: Path, scheme: str) -> None:
    """The headers of a quantized checkpoint hold packed weights and quantization state; counted as the
    values they pack, they give the config's own count, so no false "headers hold ..." warning."""
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "quantization_config": QUANT[scheme]}))
    (tmp_path / "model.safetensors").write_bytes(_safetensors(_checkpoint(scheme)))
    spec = spec_from_path(tmp_path)
    assert spec.source_kind == "safetensors"
    assert spec.declared_params == count_params(spec.arch)
    on = "none" if scheme in ("bnb-4bit", "fp8", "compressed-tensors") else "a100-80gb"
    est = api.estimate(str(tmp_path), on=on, seq_len=64)
    assert not any("safetensors headers hold" in w for w in est.warnings)


def test_unpacked_counting_leaves_a_16bit_checkpoint_alone(tmp_path: Path) -> None:
    """A tensor named like quantization state in a 16-bit checkpoint (a ``scales`` parameter) counts."""
    tensors = {**_checkpoint("fp8"), "model.layers.0.mlp.scales": ("BF16", [64])}
    tensors = {k: ("BF16", s) for k, (_, s) in tensors.items()}
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    (tmp_path / "model.safetensors").write_bytes(_safetensors(tensors))
    spec = spec_from_path(tmp_path)
    assert spec.declared_params == sum(math.prod(s) for _, s in tensors.values())


# --- the Hub, offline ----------------------------------------------------------------------------------


def test_hub_id_of_a_prequantized_repo_estimates_offline_as_qlora(tmp_path: Path) -> None:
    repo = "unsloth/llama-3-8b-Instruct-bnb-4bit"
    _cache_repo(tmp_path / "hub", repo, {"config.json": (BNB4 / "config.json").read_bytes()})
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HOME": str(tmp_path)}
    proc = run_cli(["estimate", repo, "--on", "rtx-4090", "--format", "json"], env)
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["setup"]["method"] == "qlora" and doc["setup"]["quant_storage"] == "uint8"
    assert any("pre-quantized checkpoint" in w for w in doc["warnings"])
    full = run_cli(["estimate", repo, "--on", "rtx-4090", "--method", "full"], env)
    assert full.returncode == 2 and len(full.stderr.strip().splitlines()) == 1


def test_matrix_refuses_methods_the_checkpoint_cannot_run_and_sizes_the_rest() -> None:
    env = {"HF_HUB_OFFLINE": "1"}
    proc = run_cli(["matrix", "--on", "rtx-4090", "--models", str(GPTQ)], env)
    lines = proc.stderr.strip().splitlines()
    assert (
        proc.returncode == 2
        and len(lines) == 1
        and "--methods full:" in lines[0]
        and "--methods lora" in lines[0]
    )
    ok = run_cli(
        ["matrix", "--on", "rtx-4090", "--models", str(BNB4), "--methods", "lora,qlora", "--format", "json"],
        env,
    )
    assert ok.returncode == 0, ok.stderr
    row = json.loads(ok.stdout)[0]
    assert row["lora_bytes"] == row["qlora_bytes"]  # LoRA on the 4-bit checkpoint is its QLoRA


# --- MoE experts on a quantized base ---------------------------------------------------------------------


def _merged(est: Any) -> int:
    """The largest merged-expert line of any phase (0 when the estimate carries none)."""
    lines = [c.bytes for p in est.phases for c in p.components if c.name == "merged_expert_weights"]
    return max(lines, default=0)


def test_gptq_moe_experts_are_per_expert_modules_without_a_merged_copy(tmp_path: Path) -> None:
    """GPTQ stores every expert as its own packed QuantLinear, which peft wraps one by one: no
    ParamWrapper, so no merged compute-dtype copy of the experts. The same model in 16 bits (fused 3-D
    experts under transformers 5) keeps the copy, saved per MoE layer."""
    est = api.estimate(str(GPTQ), on="h100-80gb", seq_len=512)
    assert est.setup.base_quant == "gptq" and _merged(est) == 0
    assert not any("ParamWrapper" in w or "peft merges" in w for w in est.warnings)
    plain = api.estimate(str(_unquantized(tmp_path, GPTQ)), on="h100-80gb", seq_len=512)
    cfg = _cfg(GPTQ)
    h, w, e, layers = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_experts"], 48
    assert _merged(plain) == layers * e * 3 * h * w * 2  # every layer's gate, up and down in bf16


def test_gptq_moe_adapters_count_gate_and_up_as_two_modules(tmp_path: Path) -> None:
    """Per-expert modules: gate_proj and up_proj each get rank-r factors, r (h + w) apiece; the fused
    ``gate_up_proj`` parameter gets one rank-2r pair, 2r (h + 2w). The difference is 2 r w per expert."""
    est = api.estimate(str(GPTQ), on="h100-80gb", seq_len=512, lora_rank=8)
    same = api.estimate(str(_unquantized(tmp_path, GPTQ)), on="h100-80gb", seq_len=512, lora_rank=8)
    cfg = _cfg(GPTQ)
    w, e, layers = cfg["moe_intermediate_size"], cfg["num_experts"], cfg["num_hidden_layers"]
    assert same.params.adapter - est.params.adapter == layers * e * 2 * 8 * w


def test_lora_dropout_on_gptq_moe_is_refused_for_the_router_not_the_experts(tmp_path: Path) -> None:
    """peft's ParamWrapper refuses a LoRA dropout. On the GPTQ base the experts are QuantLinear modules
    (their wrappers take a dropout), so only the router's weight, still a parameter target, is named;
    the 16-bit release names the fused experts first."""
    with pytest.raises(OptionError, match="reach gate, a parameter"):
        api.estimate(str(GPTQ), on="h100-80gb", seq_len=256, lora_dropout=0.05)
    with pytest.raises(OptionError, match=r"reach experts\.gate_up_proj, a parameter"):
        api.estimate(str(_unquantized(tmp_path, GPTQ)), on="h100-80gb", seq_len=256, lora_dropout=0.05)


def test_qlora_on_a_16bit_moe_keeps_the_merged_copy(tmp_path: Path) -> None:
    """bitsandbytes replaces nn.Linear only (transformers 5 replace_with_bnb_linear): the fused 3-D
    experts stay 16-bit parameters that peft adapts through ParamWrapper, so the merged copy remains."""
    est = api.estimate(str(_unquantized(tmp_path, GPTQ)), on="h100-80gb", method="qlora", seq_len=512)
    assert _merged(est) > 0


@pytest.mark.parametrize("fa", [False, True])
def test_gptq_moe_trainable_tensors_are_one_pair_per_expert_module(fa: bool) -> None:
    """The optimizer sees one A and one B per expert module on the GPTQ base (the allocator rounds each):
    they sum to the adapter count (minus LoRA-FA's frozen A) and the gate / up B factors are w x r."""
    from fitcheck.engine.lora import adapter_params, frozen_a_params
    from fitcheck.engine.states import trainable_shapes
    from fitcheck.models import LlmSetup

    spec = spec_from_path(GPTQ)
    setup = LlmSetup(base_quant="gptq", lora_rank=8, lora_fa=fa)
    shapes = trainable_shapes(spec.arch, setup)
    assert sum(r * c * n for r, c, n in shapes) == adapter_params(spec.arch, setup) - frozen_a_params(
        spec.arch, setup
    )
    cfg = _cfg(GPTQ)
    per_module = cfg["num_hidden_layers"] * cfg["num_experts"]
    assert (cfg["moe_intermediate_size"], 8, 2 * per_module) in shapes  # gate and up, each w x r


# --- skip lists and group sizes --------------------------------------------------------------------------


def _with(tmp_path: Path, folder: Path, **q: object) -> Path:
    """``folder``'s config with its quantization_config changed by ``q``."""
    cfg = _cfg(folder)
    cfg["quantization_config"] = {**cfg["quantization_config"], **q}
    out = tmp_path / f"{folder.name}-{len(list(tmp_path.iterdir()))}"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _parts(est: Any) -> dict[str, int]:
    return {c.name: c.bytes for c in est.phases[0].components}


#: Llama 3 8B's shapes (the fixtures' config.json): hidden 4096, MLP 14336, 32 layers, 8 KV heads of 128.
H, INTER, LAYERS, KV = 4096, 14336, 32, 1024


def test_skip_list_projections_are_sized_unquantized(tmp_path: Path) -> None:
    """``modules_to_not_convert: [mlp.down_proj]`` keeps every layer's down_proj 16-bit (transformers'
    suffix rule): weights_unquantized grows by exactly their fp16 bytes, and weights_quantized loses
    their packed bytes (0.5 B per weight + fp16 scale and 4-bit zero per 128 rows and column)."""
    base = api.estimate(str(AWQ), on="h100-80gb", seq_len=512)
    skip = api.estimate(
        str(_with(tmp_path, AWQ, modules_to_not_convert=["mlp.down_proj"])), on="h100-80gb", seq_len=512
    )
    b, k = _parts(base), _parts(skip)
    down = LAYERS * INTER * H
    assert k["weights_unquantized"] - b["weights_unquantized"] == down * 2  # fp16 checkpoint, no k-bit cast
    packed = LAYERS * (INTER * H / 2 + (INTER // 128) * H * 2.5)
    assert b["weights_quantized"] - k["weights_quantized"] == round(packed)
    assert skip.setup.quant_skip == "mlp.down_proj" and "quant_skip" not in base.setup.model_dump()
    assert any("keeps mlp.down_proj unquantized" in n for n in skip.warnings)


def test_a_layer_prefix_skips_that_layer_only(tmp_path: Path) -> None:
    """``model.layers.1`` is layer 1's whole module (a module boundary: not layers 10-19), ``lm_head`` names
    nothing inside the layers: the bitsandbytes 4-bit count drops by one layer's projections only."""
    one_layer = H * (H + 2 * KV + H) + 3 * H * INTER
    full = api.estimate(str(BNB4), on="h100-80gb", seq_len=512)
    skip = api.estimate(
        str(_with(tmp_path, BNB4, llm_int8_skip_modules=["model.layers.1", "lm_head"])),
        on="h100-80gb",
        seq_len=512,
    )
    assert full.params.quantized - skip.params.quantized == one_layer
    assert _parts(skip)["weights_unquantized"] > _parts(full)["weights_unquantized"]


@pytest.mark.parametrize("group", [32, 64, 128, -1])
def test_gptq_group_sizes_size_their_scales_and_zeros(tmp_path: Path, group: int) -> None:
    """A 4-bit GPTQ projection stores qweight (0.5 B per weight), g_idx (int32 per input row) and, per group
    of ``group`` input rows (-1: one group) and output column, an fp16 scale and a 4-bit zero; summed by
    hand over Llama 3 8B's seven projections and 32 layers."""
    cfg = {k: v for k, v in _cfg(AWQ).items() if k != "quantization_config"}
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group}
    folder = tmp_path / "gptq"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    est = api.estimate(str(folder), on="h100-80gb", seq_len=512)
    shapes = [(H, H), (H, KV), (H, KV), (H, H), (H, INTER), (H, INTER), (INTER, H)]
    want = sum(
        d_in * d_out / 2 + (1 if group == -1 else math.ceil(d_in / group)) * d_out * 2.5 + 4 * d_in
        for d_in, d_out in shapes
    )
    assert _parts(est)["weights_quantized"] == round(LAYERS * want)
    assert est.setup.quant_group == group


def test_quant_group_default_is_the_engine_group() -> None:
    from fitcheck.engine.quant import GROUP
    from fitcheck.models import LlmSetup

    assert LlmSetup.model_fields["quant_group"].default == GROUP


# --- peft's all-linear on GPTQ / AWQ layers ---------------------------------------------------------------


@pytest.mark.parametrize("where", ["awq-repo", "gptq-flag"])
def test_all_linear_asked_on_a_gptq_or_awq_base_is_refused(where: str) -> None:
    """peft's all-linear collects torch.nn.Linear / Conv1D modules only; GPTQ / AWQ layers (gptqmodel's
    BaseQuantLinear) are plain nn.Modules, so it would adapt none of the quantized projections."""
    model, extra = (str(AWQ), {}) if where == "awq-repo" else ("llama-2-7b", {"base_quant": "gptq"})
    with pytest.raises(OptionError, match=r"all-linear takes torch\.nn\.Linear and Conv1D layers only"):
        api.estimate(model, on="h100-80gb", seq_len=256, lora_targets="all-linear", **extra)
    # bitsandbytes' Linear8bitLt subclasses nn.Linear: all-linear reaches it
    est = api.estimate(
        "llama-2-7b", on="h100-80gb", seq_len=256, lora_targets="all-linear", base_quant="int8"
    )
    assert est.params.adapter > 0


def test_the_default_targets_on_a_gptq_or_awq_base_are_every_projection_by_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without --lora-targets, a dense GPTQ / AWQ base takes every projection by name (linear-modules, the
    list peft's GPTQ / AWQ dispatchers wrap), the same adapters as naming the seven projections."""
    default = api.estimate(str(AWQ), on="h100-80gb", seq_len=256)
    named = api.estimate(
        str(AWQ),
        on="h100-80gb",
        seq_len=256,
        lora_targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
    )
    assert default.setup.lora_targets == "linear-modules"
    assert default.params.adapter == named.params.adapter > 0
    from fitcheck.cli import main

    rc = main(["estimate", str(AWQ), "--on", "h100-80gb", "--lora-targets", "all-linear"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "linear-modules" in err


# --- --emit on a checkpoint stored in bitsandbytes 4-bit ----------------------------------------------------

ROOT = Path(__file__).parent.parent
#: What each format must not state for a stored 4-bit checkpoint (its own quantization_config loads it:
#: transformers ignores a BitsAndBytesConfig beside it, LLaMA-Factory ignores quantization_bit on a
#: PTQ-quantized model), and what it must keep (axolotl's adapter: qlora asks load_in_4bit).
EMIT_RULES: dict[str, tuple[tuple[str, ...], dict[str, object]]] = {
    "hf.yaml": (("load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant"), {"use_peft": True}),
    "axolotl.yaml": (("bnb_config_kwargs",), {"load_in_4bit": True, "adapter": "qlora"}),
    "llamafactory.yaml": (
        ("quantization_bit", "quantization_method", "quantization_type", "double_quantization"),
        {"finetuning_type": "lora"},
    ),
}


@pytest.mark.parametrize("fmt", sorted(EMIT_RULES))
def test_emit_on_a_stored_4bit_checkpoint_leaves_quantization_to_it(
    fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The emitted config states no 4-bit settings of its own (golden in tests/golden/prequant/, relative
    paths only), and read back with --from it poses the same QLoRA run the plan sized."""
    import yaml

    from fitcheck.cli import main
    from golden_helpers import check_golden

    monkeypatch.chdir(ROOT)
    model = str(BNB4.relative_to(ROOT))
    out = tmp_path / "out"
    trl = ["--loss", "trl"] if fmt == "hf.yaml" else []  # `trl sft` runs TRL's fused LM head
    rc = main(["plan", model, "--on", "rtx-4090", *trl, "--emit", fmt, "-o", str(out), "--format", "json"])
    capsys.readouterr()
    assert rc == 0
    text = (out / fmt).read_text()
    assert str(ROOT) not in text and str(tmp_path) not in text
    check_golden(ROOT / "tests" / "golden" / "prequant" / fmt, text, fmt)
    data = yaml.safe_load(text)
    absent, present = EMIT_RULES[fmt]
    assert not set(absent) & set(data)
    assert {k: data[k] for k in present} == present
    rc = main(["check", "--from", str(out / fmt), "--on", "rtx-4090", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc in (0, 1) and doc["setup"]["method"] == "qlora" and doc["setup"]["double_quant"] is True
    peak = next(line for line in text.splitlines() if line.startswith("# estimated peak:"))
    assert f"{doc['device_bytes'] / 2**30:.2f} GiB on the device" in peak
