"""Precedence and provenance: command line > file > trainer default > fitcheck default.

`resolve` takes what the command line gave (and which of those flags were typed), what a
``--from`` file says and the trainer's defaults, and returns the values to build the setup with,
the origin of every field (``setup_origin`` in the JSON), and the values read that the setup model
cannot hold yet ("read, not yet modelled").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from fitcheck.readers.base import ReadResult, Value
from fitcheck.readers.defaults import TABLE, Default, defaults_for

FILE = "file"
TRAINER_DEFAULT = "trainer default"
FITCHECK_DEFAULT = "fitcheck default"
COMMAND_LINE = "command line"
LORA_FIELDS = ("lora_rank", "lora_alpha", "lora_targets", "lora_dropout", "dora")


@dataclass(frozen=True)
class Resolved:
    """The merged setup values and where each came from.

    Attributes:
        values: setup field -> value, for the fields something set (the rest keep the model default).
        origin: setup field -> ``file`` | ``trainer default`` | ``fitcheck default`` | ``command line``.
        pending: values read from the file whose setup fields fitcheck does not model yet.
        sources: for ``trainer default`` fields, the cited source of the default.
        notes: what the merge set aside from the file, one sentence each.
    """

    values: dict[str, Value]
    origin: dict[str, str]
    pending: dict[str, Value] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def resolve(
    cli: Mapping[str, object],
    explicit: Collection[str],
    read: ReadResult | None,
    setup_fields: Collection[str],
) -> Resolved:
    """Merge command line, file and defaults for the fields of the setup model.

    Args:
        cli: every shared option's value as the command received it (typed or its default).
        explicit: the option names the user typed (click's parameter source is COMMANDLINE).
        read: the ``--from`` file, if any.
        setup_fields: the fields of the setup model (a field it lacks is reported as pending).
    """
    trainer = _trainer(cli, explicit, read)
    defaults = _defaults(trainer, explicit, read)
    file_values = dict(read.values) if read is not None else {}
    values: dict[str, Value] = {}
    origin: dict[str, str] = {}
    sources: dict[str, str] = {}
    for name in setup_fields:
        if name in explicit and cli.get(name) is not None:
            values[name], origin[name] = _value(cli[name]), COMMAND_LINE
        elif name in file_values:
            values[name], origin[name] = file_values[name], FILE
        elif name in defaults:
            values[name], origin[name] = defaults[name].value, TRAINER_DEFAULT
            sources[name] = defaults[name].source
        elif cli.get(name) is not None:
            values[name], origin[name] = _value(cli[name]), FITCHECK_DEFAULT
        else:
            origin[name] = FITCHECK_DEFAULT
    if "trainer" in setup_fields:
        values["trainer"] = trainer
        origin["trainer"] = COMMAND_LINE if "trainer" in explicit else FILE if read else origin["trainer"]
    if values.get("method") == "full":
        for name in LORA_FIELDS:
            if origin.get(name) != COMMAND_LINE and name in values:
                del values[name]
                origin[name] = FITCHECK_DEFAULT
    if values.get("method") != "qlora" and origin.get("double_quant") in (TRAINER_DEFAULT, FILE):
        # only QLoRA quantizes the base: no default worth reporting, nor the file's value for a method
        # the command line replaced
        values.pop("double_quant", None)
        origin["double_quant"] = FITCHECK_DEFAULT
    if origin.get("quant_storage") == FILE and values.get("method") != "qlora":
        del values["quant_storage"]  # the file's 4-bit storage, for a method the command line replaced
        origin["quant_storage"] = FITCHECK_DEFAULT
    if origin.get("optimizer_impl") == FILE and values.get("optimizer", "adamw") != "adamw":
        del values["optimizer_impl"]  # the file's AdamW step, for an optimizer the command line replaced
        origin["optimizer_impl"] = FITCHECK_DEFAULT
    if (
        origin.get("fsdp_version") == FILE
        and origin.get("strategy") == COMMAND_LINE
        and not str(values.get("strategy")).startswith("fsdp")
    ):
        del values["fsdp_version"]  # the file's FSDP wrapper, for a strategy the command line replaced
        origin["fsdp_version"] = FITCHECK_DEFAULT
    notes = _reentrant_scope(values, origin, read)
    pending = {k: v for k, v in file_values.items() if k not in setup_fields}
    return Resolved(values=values, origin=origin, pending=pending, sources=sources, notes=notes)


def _trl_zero3(values: dict[str, Value], read: ReadResult) -> tuple[str, ...]:
    """TRL's SFTTrainer forces ``use_reentrant=True`` for a PEFT model under DeepSpeed ZeRO-3 with
    checkpointing, warning when the file said false (trl/trainer/sft_trainer.py lines 1099-1116
    @f2cd5771)."""
    if read.format != "trl" or values.get("strategy") != "zero3" or values.get("ckpt_reentrant") is not False:
        return ()
    values["ckpt_reentrant"] = True
    return (
        f"{read.keys.get('ckpt_reentrant', 'use_reentrant')} false: TRL's SFTTrainer forces reentrant "
        "checkpointing for PEFT under ZeRO-3 (sft_trainer.py), so it is sized reentrant",
    )


def _reentrant_scope(
    values: dict[str, Value], origin: dict[str, str], read: ReadResult | None
) -> tuple[str, ...]:
    """A file's ``use_reentrant`` is kept only for QLoRA with gradient checkpointing, the one run where the
    kind of checkpointing can change an estimate (bitsandbytes' kept inputs, ``--bnb-keeps-input``) and the
    one the engine takes ``ckpt_reentrant`` for; elsewhere it is set aside with a note (`values` and
    `origin` are changed in place), never turned into an error about a flag nobody typed."""
    if origin.get("ckpt_reentrant") != FILE or read is None:
        return ()
    checkpointing = values.get("grad_ckpt") is True
    if values.get("method") == "qlora" and checkpointing:
        return _trl_zero3(values, read)
    del values["ckpt_reentrant"]
    origin["ckpt_reentrant"] = FITCHECK_DEFAULT
    why = "no gradient checkpointing" if not checkpointing else f"method {values.get('method', 'lora')}"
    key = read.keys.get("ckpt_reentrant", "use_reentrant")
    return (
        f"{key}: read only for QLoRA with gradient checkpointing (where bitsandbytes' kept inputs make it "
        f"matter); not used here ({why})",
    )


def _value(v: object) -> Value:
    if isinstance(v, (str, int, float, bool)):
        return v
    return str(v)


def _trainer(cli: Mapping[str, object], explicit: Collection[str], read: ReadResult | None) -> str:
    if "trainer" in explicit and cli.get("trainer") is not None:
        return str(cli["trainer"])
    if read is not None:
        return read.trainer
    return str(cli.get("trainer") or "generic")


def _defaults(trainer: str, explicit: Collection[str], read: ReadResult | None) -> dict[str, Default]:
    """Trainer-scope defaults of the trainer in use, and file-scope ones of the file's format."""
    out: dict[str, Default] = {}
    if read is not None and read.format in TABLE:
        out.update(defaults_for(read.format, ("trainer", "file")))
    if read is None or "trainer" in explicit or read.format not in TABLE:
        if read is None and "trainer" not in explicit:
            return out
        out.update(defaults_for(trainer, ("trainer",)))
    return out
