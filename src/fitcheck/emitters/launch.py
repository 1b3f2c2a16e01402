"""The launch line of a multi-GPU plan: which launcher starts which files (docs/distributed.md#launch).

One line for every header and env.sh, so the files of one plan name each other:

* ``hf.yaml``: ``trl sft --config hf.yaml --accelerate_config accelerate.yaml`` (TRL's CLI starts
  ``accelerate launch``; trl/cli/accelerate_config.py resolves a path), or with only
  ``deepspeed.json``: ``trl sft --config hf.yaml --deepspeed deepspeed.json --num_processes N``
  (``--deepspeed`` is a TrainingArguments field; ``--num_processes`` goes to accelerate);
* ``axolotl.yaml``: ``accelerate launch [--config_file accelerate.yaml | --num_processes N]
  -m axolotl.cli.train axolotl.yaml``;
* ``llamafactory.yaml``: ``FORCE_TORCHRUN=1 NPROC_PER_NODE=N NNODES=M llamafactory-cli train`` (its
  README's multi-GPU recipe), or for FSDP its docs' ``accelerate launch --config_file accelerate.yaml
  src/train.py llamafactory.yaml`` (from a LLaMA-Factory checkout);
* device-map: one process without a launcher, ``python -m trl.scripts.sft --config hf.yaml`` (or
  ``python train.py``);
* no trainer file: ``accelerate launch --config_file accelerate.yaml train.py``, else ``deepspeed
  --num_gpus N train.py --deepspeed deepspeed.json`` or ``torchrun --nproc_per_node N train.py``.
"""

from __future__ import annotations

from collections.abc import Mapping

from fitcheck.models import SetupBase


def _nodes(s: SetupBase, flag: str) -> str:
    return f" {flag} {s.nodes}" if s.nodes > 1 else ""


def launch_line(s: SetupBase, files: Mapping[str, str]) -> str | None:
    """The command that starts the run with the emitted files (format -> file name); None on one GPU."""
    if s.world_size == 1 and s.strategy is None:
        return None
    if s.strategy == "device-map":
        return _device_map(files)
    acc = files.get("accelerate.yaml")
    ds = files.get("deepspeed.json")
    procs = f"--num_processes {s.world_size}" + (f" --num_machines {s.nodes}" if s.nodes > 1 else "")
    if "hf.yaml" in files:
        cfg = f"trl sft --config {files['hf.yaml']}"
        if acc:
            return f"{cfg} --accelerate_config {acc}"
        return f"{cfg}" + (f" --deepspeed {ds}" if ds else "") + f" {procs}"
    if "axolotl.yaml" in files:
        how = f"--config_file {acc}" if acc else procs
        return f"accelerate launch {how} -m axolotl.cli.train {files['axolotl.yaml']}"
    if "llamafactory.yaml" in files:
        if acc:
            return f"accelerate launch --config_file {acc} src/train.py {files['llamafactory.yaml']}"
        return (
            f"FORCE_TORCHRUN=1 NNODES={s.nodes} NPROC_PER_NODE={s.gpus} llamafactory-cli train "
            f"{files['llamafactory.yaml']}"
        )
    if acc:
        return f"accelerate launch --config_file {acc} train.py"
    if ds:
        return f"deepspeed --num_gpus {s.gpus}{_nodes(s, '--num_nodes')} train.py --deepspeed {ds}"
    return f"torchrun --nproc_per_node {s.gpus}{_nodes(s, '--nnodes')} train.py"


#: TRL's SFT script run by plain Python: the script ``trl sft`` starts (trl 1.16.0 cli/commands/training.py),
#: without ``accelerate launch``.
TRL_SFT_ONE_PROCESS = "python -m trl.scripts.sft --config"


def _device_map(files: Mapping[str, str]) -> str:
    """One process sees every GPU, started without a launcher. ``trl sft`` always goes through ``accelerate
    launch``, which starts one process per GPU without a config and follows a default config's
    ``distributed_type`` otherwise (accelerate 1.15.0 commands/launch.py); any launch that sets LOCAL_RANK
    makes accelerate's state MULTI_GPU (state.py ``_prepare_backend``), and TRL 1.16.0's SFTTrainer then sets
    ``device_map=None`` (sft_trainer.py). ``python -m trl.scripts.sft`` runs the same script (its
    ``__main__``) in one process."""
    if "hf.yaml" in files:
        return f"{TRL_SFT_ONE_PROCESS} {files['hf.yaml']}"
    return 'python train.py (one process; the script loads the model with device_map="auto")'
