"""What peft's ``all-linear`` really wraps, against fitcheck's adapter count.

Each MoE family fitcheck reads and each multimodal wrapper is built from its small test config
(tests/test_architectures.py CASES / MM_CASES) on the meta device, ``get_peft_model`` applies
``LoraConfig(target_modules="all-linear")`` with the installed peft (0.21 when written), and the LoRA
parameters peft creates must equal `adapter_params`, and the trainable tensors `trainable_shapes` lists
for the optimizer must hold the same number. This holds the reach rules (`OUTSIDE_ALL_LINEAR`,
`PEFT_MOE_CONVERSION` in engine/params.py, the towers' linears in sources/vision.py) to peft itself.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from fitcheck.engine import lora
from fitcheck.engine.estimate import estimate
from fitcheck.engine.lora import (
    adapter_params,
    tower_adapter_params,
    validate_parameter_targets,
    validate_targets,
)
from fitcheck.engine.states import trainable_shapes
from fitcheck.errors import OptionError
from fitcheck.models import DecoderArch, LlmSetup
from fitcheck.sources.hf_config import arch_from_hf_config
from fitcheck.sources.resolve import spec_from_config
from test_architectures import CASES, MM_CASES, S
from test_hub import run_cli

RANK = 4


def _arch(model_type: str, cfg: dict[str, Any]) -> DecoderArch:
    return arch_from_hf_config({"model_type": model_type, **cfg})


MOE_TYPES = sorted(t for t, (task, cfg) in CASES.items() if task == "causal" and _arch(t, cfg).is_moe)

#: A LLaVA on a SigLIP tower with its attention-pooling head (MultiheadAttention's out_proj is an
#: nn.Linear subclass that all-linear wraps; in_proj is a bare weight).
SIGLIP_LLAVA: dict[str, Any] = {
    "text_config": {**S, "model_type": "llama"},
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 48,
                      "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
                      "vision_use_head": True},
    "image_token_index": 255,
}  # fmt: skip
MM = {**{t: (t, c) for t, c in MM_CASES.items()}, "llava-siglip-head": ("llava", SIGLIP_LLAVA)}


def _peft_counts(
    model_type: str, cfg: dict[str, Any], vision: bool, targets: str = "all-linear"
) -> tuple[int, int]:
    """(LoRA parameters, trainable parameters) of the peft model on the meta device."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    kw = {k: v for k, v in cfg.items() if v is not None or k == "q_lora_rank"}
    config = tf.AutoConfig.for_model(model_type, **kw)
    auto = tf.AutoModelForImageTextToText if vision else tf.AutoModelForCausalLM
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            model = auto.from_config(config)
        names = targets if targets == "all-linear" else targets.split(",")
        if targets == "linear-modules":
            from fitcheck.measure.build import linear_module_names

            names = linear_module_names(model)  # axolotl's rule on the real model
        if targets == "llamafactory-all":
            from fitcheck.measure.build import llamafactory_module_names

            names = llamafactory_module_names(model, model_type)  # LLaMA-Factory's rule on the real model
        pm = peft.get_peft_model(model, peft.LoraConfig(r=RANK, target_modules=names))
    params = list(pm.named_parameters())
    lora = sum(p.numel() for n, p in params if "lora_" in n)
    return lora, sum(p.numel() for _, p in params if p.requires_grad)


def _ours(a: DecoderArch, targets: str = "all-linear") -> tuple[int, int]:
    setup = LlmSetup(method="lora", lora_rank=RANK, lora_targets=targets)
    # (refused on phimoe, counted here all the same)
    if targets not in ("all-linear", "linear-modules", "llamafactory-all"):
        validate_targets(a, targets)
    return adapter_params(a, setup), sum(r * c * k for r, c, k in trainable_shapes(a, setup))


@pytest.mark.parametrize("model_type", MOE_TYPES)
def test_moe_all_linear_adapters_match_peft(model_type: str) -> None:
    cfg = CASES[model_type][1]
    assert _ours(_arch(model_type, cfg)) == _peft_counts(model_type, cfg, vision=False)


@pytest.mark.parametrize("case", sorted(MM))
def test_multimodal_all_linear_adapters_match_peft(case: str) -> None:
    model_type, cfg = MM[case]
    a = _arch(model_type, cfg)
    assert a.tower_linears  # the tower's and projector's linears are listed
    assert _ours(a) == _peft_counts(model_type, cfg, vision=True)


@pytest.mark.parametrize("model_type", MOE_TYPES)
def test_moe_linear_modules_match_axolotl_and_peft(model_type: str) -> None:
    """axolotl's ``lora_target_linear`` names on the real model, through peft, against `LINEAR_MODULES`."""
    cfg = CASES[model_type][1]
    assert _ours(_arch(model_type, cfg), "linear-modules") == _peft_counts(
        model_type, cfg, False, "linear-modules"
    )


#: Where axolotl's leaf names break the run: Qwen2-VL's merger is an ``nn.Sequential`` whose linears'
#: leaves are ``0`` and ``2``, which also name the vision blocks (`lora.LEAF_NAME_BREAKS`).
LEAF_BREAK = sorted(lora.LEAF_NAME_BREAKS)


@pytest.mark.parametrize("case", sorted(c for c in MM if c not in LEAF_BREAK))
def test_multimodal_linear_modules_match_axolotl_and_peft(case: str) -> None:
    model_type, cfg = MM[case]
    assert _ours(_arch(model_type, cfg), "linear-modules") == _peft_counts(
        model_type, cfg, True, "linear-modules"
    )


@pytest.mark.parametrize("model_type", MOE_TYPES)
def test_moe_llamafactory_all_matches_its_rule_and_peft(model_type: str) -> None:
    """LLaMA-Factory's ``lora_target: all`` names on the real model, through peft, against `LMF_ALL`."""
    cfg = CASES[model_type][1]
    assert _ours(_arch(model_type, cfg), "llamafactory-all") == _peft_counts(
        model_type, cfg, False, "llamafactory-all"
    )


@pytest.mark.parametrize("case", sorted(MM))
def test_multimodal_llamafactory_all_matches_its_rule_and_peft(case: str) -> None:
    """On a composite model LLaMA-Factory's full names reach the language model only (tower frozen)."""
    model_type, cfg = MM[case]
    a = _arch(model_type, cfg)
    assert tower_adapter_params(a, LlmSetup(method="lora", lora_targets="llamafactory-all")) == 0
    assert _ours(a, "llamafactory-all") == _peft_counts(model_type, cfg, True, "llamafactory-all")


def test_llamafactory_all_leaves_the_phimoe_router_where_axolotl_takes_it() -> None:
    """``PhimoeTopKRouter`` is an ``nn.Linear`` whose class name lacks ``Linear``: axolotl lists its leaf
    (and the run breaks, `LORA_BREAKS`), LLaMA-Factory does not."""
    a = _arch("phimoe", CASES["phimoe"][1])
    assert "router" not in lora.linear_module_names(a, by_class=True)
    assert "router" in lora.linear_module_names(a)
    validate_targets(a, "llamafactory-all")
    with pytest.raises(OptionError, match="router"):
        validate_targets(a, "linear-modules")


@pytest.mark.parametrize("case", LEAF_BREAK)
def test_qwen2_vl_linear_modules_refused_as_peft_refuses(case: str) -> None:
    model_type, cfg = MM[case]
    with pytest.raises(ValueError, match="not supported"):
        _peft_counts(model_type, cfg, True, "linear-modules")
    with pytest.raises(OptionError, match="merger's linears are named 0 and 2"):
        validate_targets(_arch(model_type, cfg), "linear-modules")


def test_qwen3_vl_linear_modules_count_the_patch_conv() -> None:
    """``proj`` also names Qwen3-VL's patch_embed Conv3d: peft's lora.Conv3d, r (in k^3) + r out."""
    a = _arch("qwen3_vl", MM_CASES["qwen3_vl"])
    assert len(a.tower_convs) == 1
    setup = LlmSetup(method="lora", lora_rank=RANK, lora_targets="linear-modules")
    i, o, n = a.tower_convs[0]
    without = a.model_copy(update={"tower_convs": ()})
    assert adapter_params(a, setup) - adapter_params(without, setup) == n * RANK * (i + o)
    assert adapter_params(a, setup.model_copy(update={"lora_targets": "all-linear"})) == adapter_params(
        without, setup.model_copy(update={"lora_targets": "all-linear"})
    )  # peft's all-linear leaves convolutions out


def test_linear_modules_leave_the_experts_without_dense_names() -> None:
    """Mixtral on transformers 5: no ``nn.Linear`` carries ``w1``/``w2``/``w3`` or ``gate``, so axolotl's
    list is the attention only, where peft's ``all-linear`` adds experts and router."""
    a = _arch("mixtral", CASES["mixtral"][1])
    assert lora.linear_module_names(a) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    attn = LlmSetup(lora_rank=RANK, lora_targets="attn")
    ours = LlmSetup(lora_rank=RANK, lora_targets="linear-modules")
    assert adapter_params(a, ours) == adapter_params(a, attn)
    assert adapter_params(a, LlmSetup(lora_rank=RANK)) > adapter_params(a, ours)


#: Named targets as recipes write them (the v4 MLP names): peft's MoE conversion turns them into the fused
#: experts' and the router's target parameters on the converted types (`PEFT_MOE_CONVERSION`); Qwen2-MoE's
#: names stay module targets (dense and shared MLPs, not the 3-D experts).
ATTN = "q_proj,k_proj,v_proj,o_proj"
NAMED = [
    ("qwen3_moe", f"{ATTN},gate_proj,up_proj,down_proj"),
    ("qwen3_moe", "q_proj,v_proj"),
    ("deepseek_v3", "q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj,gate_proj,up_proj,down_proj"),
    ("deepseek_v2", "q_proj,gate_proj,up_proj,down_proj"),
    ("glm4_moe", f"{ATTN},gate_proj,up_proj,down_proj"),
    ("glm4_moe", "gate_proj,up_proj,down_proj,gate"),
    ("mixtral", "q_proj,w1,w2,w3"),
    ("mixtral", "q_proj,gate"),
    ("qwen2_moe", "q_proj,gate_proj,up_proj,down_proj"),
    ("olmoe", f"{ATTN},down_proj"),
]


@pytest.mark.parametrize(("model_type", "targets"), NAMED)
def test_named_moe_targets_match_peft(model_type: str, targets: str) -> None:
    cfg = CASES[model_type][1]
    assert _ours(_arch(model_type, cfg), targets) == _peft_counts(model_type, cfg, False, targets)


@pytest.mark.parametrize("targets", ["q_proj,gate_proj,down_proj", "up_proj"])
def test_half_a_fused_pair_refused_as_peft_does(targets: str) -> None:
    a = _arch("qwen3_moe", CASES["qwen3_moe"][1])
    with pytest.raises(OptionError, match="gate_proj and up_proj"):
        validate_targets(a, targets)
    with pytest.raises(ValueError, match="because they are fused"):
        _peft_counts("qwen3_moe", CASES["qwen3_moe"][1], False, targets)


def test_tower_adapters_only_under_all_linear() -> None:
    a = _arch("qwen2_vl", MM_CASES["qwen2_vl"])
    for targets in ("attn", "q_proj,v_proj"):
        assert tower_adapter_params(a, LlmSetup(lora_rank=RANK, lora_targets=targets)) == 0
    assert tower_adapter_params(a, LlmSetup(lora_rank=RANK, lora_targets="all-linear")) > 0


def test_converted_moe_types_leave_dense_and_shared_mlps_out() -> None:
    """DeepSeek-V3 (first layer dense, one shared expert): all-linear adapts attention, experts and router
    only, so naming those gives the same count (and the dense and shared MLPs add none)."""
    a = _arch("deepseek_v3", CASES["deepseek_v3"][1])
    names = (
        "q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj,experts.gate_up_proj,experts.down_proj,gate"
    )
    all_linear = LlmSetup(lora_rank=RANK, lora_targets="all-linear")
    assert adapter_params(a, all_linear) == adapter_params(a, LlmSetup(lora_rank=RANK, lora_targets=names))


@pytest.mark.parametrize("targets", ["all-linear", "router", "q_proj,router"])
def test_phimoe_router_targets_refused(targets: str) -> None:
    a = _arch("phimoe", CASES["phimoe"][1])
    with pytest.raises(OptionError, match=r"PhimoeTopKRouter.*--lora-targets attn"):
        validate_targets(a, targets)


@pytest.mark.parametrize("targets", ["attn", "q_proj,k_proj,v_proj,o_proj", "gate_up_proj,down_proj"])
def test_phimoe_targets_without_router_pass(targets: str) -> None:
    validate_targets(_arch("phimoe", CASES["phimoe"][1]), targets)


def test_phimoe_all_linear_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "phimoe", **CASES["phimoe"][1]}))
    proc = run_cli(["estimate", str(tmp_path), "--on", "none"], {})
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(
        "fitcheck: error: --lora-targets all-linear"
    )


def test_qwen2_vl_linear_modules_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_vl", **MM_CASES["qwen2_vl"]}))
    proc = run_cli(["estimate", str(tmp_path), "--on", "none", "--lora-targets", "linear-modules"], {})
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "peft refuses to wrap a vision block" in proc.stderr


@pytest.mark.parametrize("targets", ["linear-modules", "llamafactory-all"])
def test_conv1d_projections_are_not_listed_by_the_trainers_rules(targets: str) -> None:
    """GPT-2's Conv1D layers: neither rule lists them, and peft refuses the empty list (the LLaMA-Factory
    rule on the real model gives none); named or all-linear they are adapted."""
    a = _arch("gpt2", CASES["gpt2"][1])
    assert _peft_counts("gpt2", CASES["gpt2"][1], False, "all-linear")[0] > 0
    with pytest.raises(ValueError, match="target_modules"):
        _peft_counts("gpt2", CASES["gpt2"][1], False, "llamafactory-all")
    with pytest.raises(OptionError, match="Conv1D"):
        validate_targets(a, targets)
    validate_targets(a, f"{targets},c_attn")  # beside a name, the name is adapted


def test_tower_lora_is_named_in_the_warnings() -> None:
    spec = spec_from_config(
        {"model_type": "qwen2_vl", **MM_CASES["qwen2_vl"]}, id="t", name="t", source="test"
    )
    a = spec.arch
    lora = estimate(spec, LlmSetup(lora_rank=RANK, seq_len=64))
    n = tower_adapter_params(a, LlmSetup(lora_rank=RANK))
    assert (
        [w for w in lora.warnings if w.startswith("all-linear also wraps the vision tower")]
        == [w for w in lora.warnings if f"{n:,} adapter parameters" in w]
        != []
    )
    for setup in (LlmSetup(lora_rank=RANK, lora_targets="attn"), LlmSetup(method="full")):
        assert not any("vision tower" in w for w in estimate(spec, setup).warnings)


def _peft_refuses(model_type: str, targets: str, **kw: Any) -> str:
    """peft's error message for this LoraConfig on the meta model, or '' when it builds."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    config = tf.AutoConfig.for_model(model_type, **CASES[model_type][1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            model = tf.AutoModelForCausalLM.from_config(config)
        names = targets if targets == "all-linear" else targets.split(",")
        try:
            peft.get_peft_model(model, peft.LoraConfig(r=RANK, target_modules=names, **kw))
        except ValueError as e:
            return str(e)
    return ""


#: (model_type, targets, LoraConfig keyword, fitcheck setup): whether the targets reach a parameter that
#: peft adapts through ParamWrapper, which refuses DoRA and LoRA dropout.
PARAM_CASES = [
    ("qwen3_moe", "all-linear", {"use_dora": True}, {"dora": True}, True),
    ("qwen3_moe", "all-linear", {"lora_dropout": 0.05}, {"lora_dropout": 0.05}, True),
    ("mixtral", "q_proj,gate", {"use_dora": True}, {"dora": True}, True),
    ("deepseek_v3", "o_proj,gate_proj,up_proj", {"lora_dropout": 0.1}, {"lora_dropout": 0.1}, True),
    ("qwen3_moe", ATTN, {"use_dora": True}, {"dora": True}, False),
    ("gpt_oss", "all-linear", {"lora_dropout": 0.05}, {"lora_dropout": 0.05}, False),
    ("qwen2_moe", "all-linear", {"use_dora": True}, {"dora": True}, False),
]


@pytest.mark.parametrize(("model_type", "targets", "peft_kw", "ours_kw", "refused"), PARAM_CASES)
def test_dora_and_dropout_on_parameter_targets_refused_as_peft_does(
    model_type: str, targets: str, peft_kw: dict[str, Any], ours_kw: dict[str, Any], refused: bool
) -> None:
    a = _arch(model_type, CASES[model_type][1])
    setup = LlmSetup(lora_rank=RANK, lora_targets=targets, **ours_kw)
    if refused:
        with pytest.raises(OptionError, match="ParamWrapper"):
            validate_parameter_targets(a, setup)
        assert "ParamWrapper does not work" in _peft_refuses(model_type, targets, **peft_kw)
    else:
        validate_parameter_targets(a, setup)
        assert _peft_refuses(model_type, targets, **peft_kw) == ""


@pytest.mark.parametrize("targets", ["q_proj,wq", "q_proj,v_proj,not_a_module", "down_proj,c_attn"])
def test_unmatched_names_beside_matched_ones_are_ignored_as_peft_does(targets: str) -> None:
    """peft raises only when no target matches at all; the rest it ignores. fitcheck counts the same
    adapters and warns, naming what matched nothing."""
    cfg = CASES["llama"][1]
    a = _arch("llama", cfg)
    assert _ours(a, targets) == _peft_counts("llama", cfg, vision=False, targets=targets)
    spec = spec_from_config({"model_type": "llama", **cfg}, id="t", name="t", source="test")
    est = estimate(spec, LlmSetup(lora_targets=targets, seq_len=64))
    warned = [w for w in est.warnings if "no module" in w]
    missing = [t for t in targets.split(",") if not t.endswith("proj")]
    assert len(warned) == 1 and all(f"'{m}'" in warned[0] for m in missing)


def test_all_unmatched_names_refused_as_peft_refuses() -> None:
    assert "not found in the base model" in _peft_refuses("llama", "wq,wk")
    with pytest.raises(OptionError, match="no module 'wq', 'wk'"):
        validate_targets(_arch("llama", CASES["llama"][1]), "wq,wk")


@pytest.mark.parametrize("trainer", ["torchtune", "litgpt", "mlx"])
def test_trainers_with_their_own_lora_refuse_any_unmatched_name(trainer: str) -> None:
    """torchtune, litgpt and mlx-lm build LoRA themselves and fail on a module their model lacks
    (engine/lora.py OWN_LORA_TRAINERS): one unmatched name is refused, not ignored."""
    spec = spec_from_config({"model_type": "llama", **CASES["llama"][1]}, id="t", name="t", source="test")
    with pytest.raises(OptionError, match="no module 'wq'"):
        estimate(spec, LlmSetup(lora_targets="q_proj,wq", seq_len=64, trainer=trainer))


def test_measure_replaces_the_linear_modules_token_with_the_models_names() -> None:
    torch = pytest.importorskip("torch")
    from fitcheck.measure.build import _with_linear_modules

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj, self.lm_head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 8)
            self.norm = torch.nn.LayerNorm(4)

    assert _with_linear_modules(["linear-modules", "embed_tokens"], Tiny()) == ["embed_tokens", "q_proj"]
    assert _with_linear_modules("all-linear", Tiny()) == "all-linear"
    assert _with_linear_modules(["q_proj"], Tiny()) == ["q_proj"]


def test_measure_replaces_the_llamafactory_token_by_class_name() -> None:
    """LLaMA-Factory's rule tests the class name: an ``nn.Linear`` subclass named without ``Linear`` (a
    router) is left out, where axolotl's ``isinstance`` takes it."""
    torch = pytest.importorskip("torch")
    from fitcheck.measure.build import _with_linear_modules

    class TopKRouter(torch.nn.Linear):
        pass

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj, self.lm_head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 8)
            self.router = TopKRouter(4, 2)

    assert _with_linear_modules(["llamafactory-all"], Tiny(), "mixtral") == ["q_proj"]
    assert _with_linear_modules(["linear-modules"], Tiny(), "mixtral") == ["q_proj", "router"]


def test_awq_vl_default_targets_are_the_language_models_names(tmp_path: Path) -> None:
    """On an AWQ Qwen2-VL the default all-linear cannot stand (peft reaches no WQLinear) and neither can
    linear-modules (the merger's leaf names also name vision blocks): the default names the language
    model's projections, with no error about a --lora-targets the user never gave."""
    import json

    from fitcheck import api

    cfg = {**MM_CASES["qwen2_vl"], "model_type": "qwen2_vl", "torch_dtype": "float16"}
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    est = api.estimate(str(tmp_path), method="lora")
    a = _arch("qwen2_vl", MM_CASES["qwen2_vl"])
    assert est.setup.lora_targets == ",".join(lora.linear_module_names(a))
    with pytest.raises(OptionError, match="merger's linears"):
        api.estimate(str(tmp_path), method="lora", lora_targets="linear-modules")
