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
* device-map: one process, ``trl sft --config hf.yaml --num_processes 1`` (or ``python train.py``);
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


def _device_map(files: Mapping[str, str]) -> str:
    """One process sees every GPU: ``--num_processes 1`` keeps ``accelerate launch`` (which TRL's CLI runs)
    from starting one per GPU (accelerate 1.15.0 commands/launch.py: without a config, ``num_processes`` is
    the GPU count and several turn multi-GPU on, and TRL then drops the device map)."""
    if "hf.yaml" in files:
        return f"trl sft --config {files['hf.yaml']} --num_processes 1"
    return 'python train.py (one process; the script loads the model with device_map="auto")'
