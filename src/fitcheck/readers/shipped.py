"""The DeepSpeed JSONs axolotl and LLaMA-Factory ship, by the relative path their example configs name.

An axolotl file's ``deepspeed: deepspeed_configs/zero3_bf16.json`` and a LLaMA-Factory file's
``deepspeed: examples/deepspeed/ds_z3_config.json`` name a file of the trainer's own repository (axolotl's
``axolotl fetch deepspeed_configs`` copies them into the working folder). When that file is not found
beside the config or in the working folder, its ZeRO block as the trainer ships it is read instead, so the
ZeRO stage (which shards the model under ZeRO-3) is not lost. Each entry is the ``zero_optimization`` keys
that decide memory, copied from the file at the commit named: ``stage``, ``offload_optimizer.device``,
``offload_param.device``, ``overlap_comm`` and a numeric ``reduce_bucket_size`` ("auto" ones are left out:
the HF Trainer fills them). Files that the DeepSpeed reader would refuse (LLaMA-Factory's
``ds_z2_autotp_config.json``) or that carry blocks fitcheck does not model (``ds_z3_fp8_config.json``) are
not listed: their path is noted as before.
"""

from __future__ import annotations

from pathlib import PurePosixPath

_AX = "axolotl-ai-cloud/axolotl@067b021c deepspeed_configs/"
_LF = "hiyouga/LLaMA-Factory@ff6d4d12 examples/deepspeed/"

#: (trainer format, folder the configs name) -> file name -> (source, ``zero_optimization`` subset).
SHIPPED: dict[tuple[str, str], dict[str, tuple[str, dict[str, object]]]] = {
    ("axolotl", "deepspeed_configs"): {
        "zero1.json": (_AX, {"stage": 1, "overlap_comm": True}),
        "zero1_torch_compile.json": (_AX, {"stage": 1, "overlap_comm": True}),
        "zero2.json": (_AX, {"stage": 2, "offload_optimizer": {"device": "cpu"}, "overlap_comm": True}),
        "zero2_torch_compile.json": (
            _AX,
            {"stage": 2, "offload_optimizer": {"device": "cpu"}, "overlap_comm": True},
        ),
        "zero3.json": (_AX, {"stage": 3, "overlap_comm": True}),
        "zero3_bf16.json": (_AX, {"stage": 3, "overlap_comm": True}),
        "zero3_bf16_cpuoffload_all.json": (
            _AX,
            {
                "stage": 3,
                "offload_optimizer": {"device": "cpu"},
                "offload_param": {"device": "cpu"},
                "overlap_comm": True,
            },
        ),
        "zero3_bf16_cpuoffload_params.json": (
            _AX,
            {"stage": 3, "offload_param": {"device": "cpu"}, "overlap_comm": True},
        ),
    },
    ("llamafactory", "examples/deepspeed"): {
        "ds_z0_config.json": (_LF, {"stage": 0, "overlap_comm": False, "reduce_bucket_size": 500000000}),
        "ds_z2_config.json": (_LF, {"stage": 2, "overlap_comm": False, "reduce_bucket_size": 500000000}),
        "ds_z2_offload_config.json": (
            _LF,
            {
                "stage": 2,
                "offload_optimizer": {"device": "cpu"},
                "overlap_comm": False,
                "reduce_bucket_size": 500000000,
            },
        ),
        "ds_z3_config.json": (_LF, {"stage": 3, "overlap_comm": False}),
        "ds_z3_offload_config.json": (
            _LF,
            {
                "stage": 3,
                "offload_optimizer": {"device": "cpu"},
                "offload_param": {"device": "cpu"},
                "overlap_comm": False,
            },
        ),
    },
}


def shipped(fmt: str, name: str) -> tuple[str, dict[str, object]] | None:
    """The trainer's own DeepSpeed file a ``deepspeed:`` path names (its last folders and file name), as
    (source, a DeepSpeed JSON holding its ZeRO block), or None when the path names none of them."""
    path = PurePosixPath(name.replace("\\", "/"))
    for (trainer, folder), files in SHIPPED.items():
        if trainer != fmt or path.name not in files:
            continue
        if str(path.parent).endswith(folder):
            source, zero = files[path.name]
            return source + path.name, {"zero_optimization": zero}
    return None
