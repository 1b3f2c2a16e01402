"""transformers' optimizer names (``TrainingArguments.optim``, axolotl's ``optimizer``) and what they run.

One table for both directions: the readers (``--from`` a TRL/HF or axolotl config) map a name to the
fitcheck optimizer whose memory it has, and the emitters (hf.yaml, axolotl, LLaMA-Factory) write, for
each fitcheck optimizer, the FIRST name listed for it. Source: transformers ``OptimizerNames``
(src/transformers/training_args.py; the 5.x list in tests/data/trainer_keys/hf_training_arguments.txt)
and axolotl's CustomSupportedOptimizers (``optimi_adamw``, ``ao_adamw_8bit``; trainer_keys/axolotl_keys.txt).
Only names whose memory fitcheck models are mapped; another name is reported, not guessed.
"""

from __future__ import annotations

#: transformers ``optim`` -> fitcheck optimizer. The paged and fused variants keep the same states
#: (paged ones page them to the CPU under pressure). The first name of each optimizer is the one
#: written: fused AdamW runs on every backend fitcheck plans for (torch's fused-kernel devices include
#: cuda, mps and cpu: torch/utils/_foreach_utils.py), as the engine's hf regime assumes.
HF_OPTIM: dict[str, str] = {
    "adamw_torch_fused": "adamw",
    "adamw_torch": "adamw",
    "adamw_hf": "adamw",
    "adamw_apex_fused": "adamw",
    "adamw_anyprecision": "adamw",
    "paged_adamw_32bit": "paged-adamw",
    "optimi_adamw": "adamw",
    "adamw_8bit": "adamw8bit",
    "adamw_bnb_8bit": "adamw8bit",
    "adamw_torch_8bit": "adamw8bit",
    "ao_adamw_8bit": "adamw8bit",
    "paged_adamw_8bit": "paged-adamw8bit",
    "adafactor": "adafactor",
    "lion_32bit": "lion",
    "paged_lion_32bit": "lion",
    "lion_8bit": "lion8bit",
    "paged_lion_8bit": "lion8bit",
    "sgd": "sgd",
}


def _written() -> dict[str, str]:
    out: dict[str, str] = {}
    for name, optimizer in HF_OPTIM.items():
        out.setdefault(optimizer, name)
    return out


#: fitcheck optimizer -> the ``optim`` name the emitters write (derived: the first name of each).
HF_OPTIM_WRITTEN: dict[str, str] = _written()

#: ``optim`` names that pick torch AdamW's step (fitcheck ``--optimizer-impl``). transformers
#: ``Trainer.get_optimizer_cls_and_kwargs`` builds ``torch.optim.AdamW`` for both and adds
#: ``fused=True`` for ``adamw_torch_fused`` only (src/transformers/trainer.py, 4.46 to 5.x), so
#: ``adamw_torch`` runs torch's default step on CUDA tensors, the foreach one (torch optim/adamw.py
#: ``_default_to_fused_or_foreach``). The other AdamW names are other implementations (apex,
#: bitsandbytes, transformers' own), which ``--optimizer-impl`` does not describe.
HF_OPTIM_IMPL: dict[str, str] = {"adamw_torch_fused": "fused", "adamw_torch": "foreach"}


def optim_written(optimizer: str, impl: str | None) -> str:
    """The ``optim`` name for a fitcheck optimizer and AdamW step: the first name of the optimizer,
    or the name that picks the step when one is asked (`HF_OPTIM_IMPL`); torch 2.0's foreach step
    (``foreach-2.0``) is the same ``adamw_torch`` run by an older torch."""
    if optimizer == "adamw" and impl is not None:
        step = "foreach" if impl == "foreach-2.0" else impl
        return next(name for name, s in HF_OPTIM_IMPL.items() if s == step)
    return HF_OPTIM_WRITTEN[optimizer]
