"""The config keys that switch a trainer to a cross-entropy kernel other than its own: one table for
the emitters (which write them) and the readers (which map them back to ``--loss``).

Per trainer format and fitcheck loss kernel: the boolean key that turns it on and the axolotl plugin
that key belongs to (None: a key of the trainer itself). Sources: transformers TrainingArguments
``use_liger_kernel`` (trainer_keys/hf_training_arguments.txt); axolotl's Liger plugin (LigerArgs
``liger_fused_linear_cross_entropy``, integrations/liger/args.py @0763f1ab) and Cut Cross Entropy plugin
(CutCrossEntropyArgs ``cut_cross_entropy``, integrations/cut_cross_entropy/args.py @1188fdc1)
(trainer_keys/axolotl_plugin_keys.txt); LLaMA-Factory ``enable_liger_kernel``
(trainer_keys/llamafactory_keys.txt). Within a format, the first key set wins when reading.
"""

from __future__ import annotations

LOSS_SWITCHES: dict[str, dict[str, tuple[str, str | None]]] = {
    "hf": {"liger": ("use_liger_kernel", None)},
    "axolotl": {
        "cce": ("cut_cross_entropy", "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"),
        "liger": ("liger_fused_linear_cross_entropy", "axolotl.integrations.liger.LigerPlugin"),
    },
    "llamafactory": {"liger": ("enable_liger_kernel", None)},
}
#: Plugin switches that are on when the file loads the plugin and leaves the key unset: axolotl's
#: ``CutCrossEntropyArgs.cut_cross_entropy: Optional[bool] = True`` (integrations/cut_cross_entropy/args.py
#: @067b021c), so ``plugins: [...CutCrossEntropyPlugin]`` alone switches the loss to CCE. (LigerArgs'
#: ``liger_fused_linear_cross_entropy`` defaults to None: off.)
ON_WITH_PLUGIN: frozenset[str] = frozenset({"cut_cross_entropy"})
#: What each kernel is, as the emitted file's comment says it.
LOSS_WORDS: dict[str, str] = {
    "liger": "Liger's fused linear cross-entropy",
    "cce": "Apple's Cut Cross Entropy",
}
