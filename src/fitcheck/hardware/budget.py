"""Usable memory: turn a ``--on`` spec (catalog id, ``24GB``, ``36GB-unified``, ``2x4090``, ``auto``,
``cpu``) into a `Target` whose `BudgetLine` steps show the arithmetic.

Budget lines are signed byte amounts: the lines before ``usable`` sum to it, and ``usable`` minus
``headroom`` is ``budget`` (what an estimate's ``device_bytes`` is compared with). The CUDA
context is *not* subtracted here: it is counted once, on the estimate side, from
``Target.context_bytes``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from fitcheck.errors import FitcheckError, InputError, suggest
from fitcheck.facts.context import DEFAULT_CONTEXT_MIB, HOPPER_CONTEXT_MIB
from fitcheck.hardware import catalog
from fitcheck.hardware.catalog import HardwareEntry
from fitcheck.hardware.detected import AppleFacts, CpuMemory, Detection, GpuDevice
from fitcheck.hardware.env import ProbeEnv
from fitcheck.models import Backend, BudgetLine, Target
from fitcheck.terminal import clipped
from fitcheck.units import GIB, MEM_EXPONENT_RE, MIB, SizeRangeError, fmt_gib, parse_memory

#: Default headroom: none. The estimate's band (engine/band.py) now carries what the old default (5 % of
#: usable memory, at least 0.5 GiB) stood for: fragmentation and workspaces, measured rather than guessed
#: (issue 10). A margin given with --headroom still comes off the budget.
DEFAULT_HEADROOM_BYTES = 0

#: The source documents: on a Mac "about three quarters" of unified memory is free for training
#: (36 GB laptop -> 27 GB usable). Metal's recommendedMaxWorkingSetSize, when measured, replaces it.
APPLE_USABLE_NUM, APPLE_USABLE_DEN = 3, 4
APPLE_RANGE_NOTE = (
    "Metal's recommendedMaxWorkingSetSize has been observed between 2/3 of RAM (16-32 GB Macs, older "
    "macOS) and 0.84 (128 GB, macOS 26); 75 % is the source documents' rule, the measured value replaces "
    "it on the Mac"
)
APPLE_NOTES = (
    "PyTorch's MPS allocator may allocate past the working set (default "
    "PYTORCH_MPS_HIGH_WATERMARK_RATIO=1.7 x recommendedMaxWorkingSetSize) and slide into swap, about 10x "
    "slower, before it reports out of memory",
    "PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 lifts PyTorch's cap entirely (risk: heavy swap, system "
    "instability); 1.0 (with PYTORCH_MPS_LOW_WATERMARK_RATIO <= 1.0) fails fast at the working set instead",
    "attention under MPS keeps O(s^2) fp32 score tensors in training (SDPA has no memory-efficient "
    "backward on MPS), so long sequences cost far more than on CUDA flash/SDPA kernels",
)
#: What stands for `APPLE_NOTES` when the run is MLX's (``--trainer mlx``), not PyTorch's MPS backend
#: (mlx v0.32.0: python/src/memory.cpp ``set_memory_limit``'s docstring, mlx/backend/metal/allocator.cpp
#: ``block_limit_``, mlx/transforms.cpp ``eval_impl``; mlx-lm v0.31.3 tuner/trainer.py ``train`` line 229).
#: MLX's unfused training attention is the estimate's warning (engine/estimate.py `_setup_warnings`).
MLX_NOTES = (
    "MLX's memory limit (mx.set_memory_limit; default 1.5 x recommendedMaxWorkingSetSize, at most 95% of "
    "RAM) is a guideline: past it evaluation waits for queued GPU work before going on, and an allocation "
    "fails only when RAM and swap are exhausted, so a run past the working set pages (slowly) rather than "
    "stops; mlx-lm's train() raises the wired limit to the working set",
)


def trainer_notes(target: Target, trainer: str | None) -> tuple[str, ...]:
    """The target's notes for the run's trainer: on a Mac, MLX's own in place of PyTorch MPS's
    (`APPLE_NOTES`)."""
    notes = target.notes
    if trainer != "mlx" or target.backend != "mps":
        return notes
    return (*(n for n in notes if n not in APPLE_NOTES), *MLX_NOTES)


#: Idle use (total - free at idle, MiB) when a card's own figure is unknown. Datacenter: the
#: largest headless driver reservation observed (H200, 613 MiB incl. rounding); consumer and
#: workstation cards usually drive a desktop: RTX 4080 SUPER with a display, 1028 MiB (exporter
#: captures, github.com/utkuozdemir/nvidia_gpu_exporter internal/captures).
DEFAULT_IDLE_MIB = {"datacenter": 613, "workstation": 1028, "consumer": 1028}
#: A plain size (``24GB``) is read as a consumer card with a display.
PLAIN_IDLE_MIB = DEFAULT_IDLE_MIB["consumer"]
MAX_GPUS = 4096
#: A bare number above this is a card model (``3060``), not GiB: no device has more than 512 GiB.
MAX_BARE_GIB = 1024

TARGET_HELP = (
    "a target is a catalog id (rtx-4090, a100-80gb; see `fitcheck hw list`), a GPU size (24GB), "
    "a Mac's unified memory (36GB-unified), a count of devices (2x4090), auto or cpu"
)
# ASCII digits only (re.ASCII): \d and int() also take other scripts' digits ("２x4090", "٢٤GB")
_COUNT_RE = re.compile(r"^(\d+)\s*[x×]\s*(\S.*)$", re.ASCII)
_SIZE_RE = re.compile(r"^[+-]?\d*\.?\d+\s*(?:gib|gb|g|mib|mb|m|tib|tb|t)?$", re.ASCII)
_SIZE_PREFIX_RE = re.compile(r"^[+-]?\d*\.?\d+\s*(?:gib|gb|g|mib|mb|m|tib|tb|t)?-", re.ASCII)


def resolve_target(spec: str, headroom: str | None = None, probe_env: ProbeEnv | None = None) -> Target:
    """The machine a run is judged against, from ``--on`` and ``--headroom``.

    Args:
        spec: catalog id or alias, ``24GB``/``24GiB``/``24`` (a CUDA GPU of that size),
            ``36GB-unified`` (a Mac), ``2x4090`` (N data-parallel copies, per-GPU budget
            unchanged), ``auto`` (detect this machine) or ``cpu`` (this machine's RAM).
        headroom: safety margin, ``2GB`` or ``10%`` of usable memory; None for the default (none:
            the estimate's band carries what a default margin stood for).
        probe_env: the machine to probe for ``auto`` and ``cpu`` (tests inject recorded output);
            None probes the live machine.

    Raises:
        InputError: malformed sizes (``0GB``, ``-24GB``, ``36GB-unfied``) or counts, or headroom.
        NotFoundError: an unknown catalog id, with the closest ids.
    """
    text = spec.strip().lower()
    if not text:
        raise InputError(f"--on is empty: {TARGET_HELP}")
    count_match = _COUNT_RE.match(text)
    if count_match and catalog.find_entry(text) is None:
        if not 1 <= int(count_match.group(1)) <= MAX_GPUS:  # before the device: 0x1GB is a count error
            raise InputError(f"'{spec}': the device count must be between 1 and {MAX_GPUS}")
        base = _resolve_one(count_match.group(2).strip(), spec, probe_env)
        target = _times(base, int(count_match.group(1)), spec)
    else:
        target = _resolve_one(text, spec, probe_env)
    if target.host_memory_bytes is None and target.backend in ("cuda", "rocm"):
        from fitcheck.hardware.nodes import host_ram_bytes

        base_id = count_match.group(2).strip() if count_match else text
        entry = catalog.find_entry(base_id)
        ram = host_ram_bytes(entry.id) if entry is not None else None
        target = target.model_copy(update={"host_memory_bytes": ram})
    return apply_headroom(target, headroom)


def _resolve_one(text: str, spec: str, probe_env: ProbeEnv | None) -> Target:
    if text in {"auto", "cpu"}:
        from fitcheck.hardware.probes import detect, probe_cpu

        env = probe_env or ProbeEnv.real()
        if text == "auto":
            return target_from_detection(detect(env), dict(env.environ))
        mem, _ = probe_cpu(env)
        return cpu_target(_need_cpu(mem))
    entry = catalog.find_entry(text)
    if entry is not None:
        return entry_target(entry)
    if text.endswith("-unified"):
        return unified_target(_size(text.removesuffix("-unified"), spec))
    if re.fullmatch(r"[0-9]+", text) and int(text) > MAX_BARE_GIB:
        hint = suggest(text, catalog.load_catalog())
        raise InputError(
            f"'{spec}' is not a memory size fitcheck believes"
            + (f"; {hint}" if hint else "")
            + f" (write {text}GB if you mean it; {TARGET_HELP})"
        )
    if _SIZE_RE.match(text) or MEM_EXPONENT_RE.match(text):
        typed = spec.strip()
        return plain_cuda_target(_size(text, spec), typed if typed.lower() == text else text)
    if _SIZE_PREFIX_RE.match(text):
        raise InputError(
            f"'{spec}' is not a target: did you mean {spec.strip().split('-')[0]}-unified? {TARGET_HELP}"
        )
    catalog.get_entry(text)  # raises NotFoundError with suggestions
    raise AssertionError("unreachable")  # pragma: no cover


def _size(text: str, spec: str) -> int:
    """A size target's bytes; an error quotes the size as the user wrote it when it is the whole spec."""
    typed = spec.strip()
    try:
        return parse_memory(typed if typed.lower() == text else text)
    except SizeRangeError as exc:
        raise InputError(f"--on {exc}") from None
    except InputError:
        raise InputError(
            f"'{spec}' is not a usable size: memory must be a number above zero; {TARGET_HELP}"
        ) from None


def _times(base: Target, count: int, spec: str) -> Target:
    if not 1 <= count <= MAX_GPUS:
        raise InputError(f"'{spec}': the device count must be between 1 and {MAX_GPUS}")
    if base.backend in {"mps", "cpu"}:
        raise InputError(
            f"'{spec}': data parallel across several {base.backend} devices is not modelled; {TARGET_HELP}"
        )
    note = (
        f"{count} GPUs: the budget is per GPU; what each GPU holds depends on --strategy "
        "(ddp keeps a full copy on each, ZeRO/FSDP shard, device-map splits the layers)"
    )
    return base.model_copy(
        update={
            "id": f"{count}x{base.id}",
            "name": f"{count} x {base.name}",
            "gpus": count,
            "notes": (*base.notes, note),
        }
    )


# -------------------------------------------------------------------------------------------- headroom


def parse_headroom(text: str | None, usable_bytes: int) -> tuple[int, str]:
    """Headroom in bytes and how it was chosen: ``2GB``, ``10%`` of usable, or the default."""
    if text is None:
        why = "default: none (the estimate's band carries fragmentation and workspaces)"
        return DEFAULT_HEADROOM_BYTES, why
    raw = text.strip().lower()
    if raw.endswith("%"):
        # a plain decimal, as memory sizes are (an exponent, nan or inf is refused, as in `parse_memory`)
        number = raw[:-1].strip()
        pct = float(number) if re.fullmatch(r"[0-9]+(\.[0-9]*)?|\.[0-9]+", number) else -1.0
        if not 0 <= pct < 100:
            raise InputError(f"--headroom '{text}': a percentage must be from 0% to under 100%, e.g. 10%")
        return round(usable_bytes * pct / 100), f"{pct:g} % of usable memory"
    if re.fullmatch(r"0*\.?0*\s*(gib|gb|g|mib|mb|m)?", raw) and any(c.isdigit() for c in raw):
        return 0, "none (--headroom 0)"
    try:
        return parse_memory(text.strip()), f"--headroom {text}"
    except SizeRangeError as exc:
        raise InputError(f"--headroom {exc}") from None
    except InputError:
        raise InputError(
            f"--headroom '{text}' is not a size or a percentage: use e.g. 2GB, 512MB or 10%"
        ) from None


def apply_headroom(target: Target, headroom: str | None) -> Target:
    """Set the headroom and append the ``headroom`` and ``budget`` lines."""
    amount, how = parse_headroom(headroom, target.usable_bytes)
    if amount > target.usable_bytes and headroom is not None:
        raise InputError(
            f"--headroom {headroom} is more than the {fmt_gib(target.usable_bytes)} usable on {target.id}"
        )
    amount = min(amount, target.usable_bytes)
    lines = (
        *target.budget_lines,
        BudgetLine(name="headroom", bytes=-amount, note=how),
        BudgetLine(
            name="budget",
            bytes=target.usable_bytes - amount,
            note="what the estimate's band (high_bytes) must fit",
        ),
    )
    return target.model_copy(update={"headroom_bytes": amount, "budget_lines": lines})


# ------------------------------------------------------------------------------------- catalog / plain


def _context(entry: HardwareEntry | None, backend: str) -> int:
    return (entry.context_mib if entry else DEFAULT_CONTEXT_MIB[backend]) * MIB


def _usable_line(lines: Sequence[BudgetLine], note: str) -> tuple[BudgetLine, ...]:
    return (*lines, BudgetLine(name="usable", bytes=sum(line.bytes for line in lines), note=note))


def entry_target(entry: HardwareEntry) -> Target:
    """A catalog device, not detected: the driver's total where known, minus typical idle use (GPU) or a
    quarter (Mac)."""
    if entry.backend == "mps":
        target = unified_target(entry.total_bytes)
        notes = list(target.notes)
        if entry.working_set_observed_mib:
            notes.insert(
                0, f"observed recommendedMaxWorkingSetSize for this Mac: {entry.working_set_observed_mib} MiB"
            )
        return target.model_copy(
            update={
                "id": entry.id,
                "name": entry.name,
                "bf16": entry.bf16_supported,
                "source": f"catalog presets/hardware/{entry.id}.yaml",
                "notes": (*entry.notes, *notes),
            }
        )
    total = entry.total_bytes
    if entry.driver_total_mib is not None:
        total_note = (
            f"driver-reported total {entry.driver_total_mib} MiB ({entry.sources['driver_total_mib'][0]})"
        )
    else:
        total_note = f"{entry.memory_gib:g} GiB as marketed (no driver total observed for this card)"
    if entry.idle_used_mib is not None:
        idle, idle_note = (
            entry.idle_used_mib,
            f"observed idle use of this card ({entry.sources['idle_used_mib'][0]})",
        )
    else:
        idle = DEFAULT_IDLE_MIB[entry.segment]
        idle_note = f"typical idle use of a {entry.segment} GPU (driver reservation, desktop), {idle} MiB"
    lines = _usable_line(
        (
            BudgetLine(name="device_memory", bytes=total, note=total_note),
            BudgetLine(name="idle_use", bytes=-idle * MIB, note=idle_note),
        ),
        "memory a new process can expect to find free",
    )
    return Target(
        id=entry.id,
        name=entry.name,
        backend=entry.backend,
        memory_bytes=total,
        usable_bytes=_positive(lines[-1].bytes, entry.id),
        headroom_bytes=0,
        budget_lines=lines,
        context_bytes=_context(entry, entry.backend),
        bf16=entry.bf16_supported,
        source=f"catalog presets/hardware/{entry.id}.yaml",
        notes=(*entry.notes, _context_note(entry.context_mib, entry.backend)),
    )


def _context_note(context_mib: int, backend: str) -> str:
    what = "HIP" if backend == "rocm" else "CUDA"
    return f"the {what} context ({context_mib} MiB per process) is counted on the estimate side, not here"


def _positive(amount: int, what: str) -> int:
    if amount <= 0:
        raise InputError(
            f"'{what}' leaves no usable memory once typical idle use is taken: give a larger size"
        )
    return amount


def gib_label(memory_bytes: int) -> str:
    """A typed size in GiB as an id and a note show it: ``24``, ``0.5``, ``1048576`` (``:g`` would write
    ``1.04858e+06``), at most six decimals."""
    return f"{memory_bytes / GIB:.6f}".rstrip("0").rstrip(".")


def plain_cuda_target(memory_bytes: int, typed: str | None = None) -> Target:
    """``24GB``: a CUDA GPU of that size (binary units), minus a consumer card's typical idle use.

    ``typed``: the size as the user wrote it, which an error quotes (``24MiB``, not ``0.0234375GB``).
    """
    label = gib_label(memory_bytes)
    lines = _usable_line(
        (
            BudgetLine(
                name="device_memory",
                bytes=memory_bytes,
                note=f"{label} GiB as typed (24GB and 24GiB both mean GiB)",
            ),
            BudgetLine(
                name="idle_use",
                bytes=-PLAIN_IDLE_MIB * MIB,
                note=f"typical idle use of a consumer GPU driving a display, {PLAIN_IDLE_MIB} MiB",
            ),
        ),
        "memory a new process can expect to find free",
    )
    return Target(
        id=f"cuda-{label}gib",
        name=f"CUDA GPU with {label} GiB",
        backend="cuda",
        memory_bytes=memory_bytes,
        usable_bytes=_positive(lines[-1].bytes, typed or f"{label}GB"),
        headroom_bytes=0,
        budget_lines=lines,
        context_bytes=DEFAULT_CONTEXT_MIB["cuda"] * MIB,
        bf16=True,
        source="size given on the command line",
        notes=(
            "bf16 assumed (Ampere or newer); name the card (e.g. rtx-2080-ti) for its real capabilities",
            _context_note(DEFAULT_CONTEXT_MIB["cuda"], "cuda"),
        ),
    )


def unified_target(memory_bytes: int, facts: AppleFacts | None = None) -> Target:
    """A Mac: the GPU working set out of unified memory (measured when known, else 75 %)."""
    label = gib_label(memory_bytes)
    usable, note = _working_set(memory_bytes, facts)
    lines = (
        BudgetLine(name="unified_memory", bytes=memory_bytes, note=f"{label} GiB unified memory"),
        BudgetLine(
            name="os_and_apps", bytes=usable - memory_bytes, note="macOS, other apps, GPU wiring limit"
        ),
        BudgetLine(name="usable", bytes=usable, note=note),
    )
    notes = [APPLE_RANGE_NOTE, *APPLE_NOTES]
    if facts is not None and facts.rosetta:
        notes.insert(0, "x86_64 Python under Rosetta: PyTorch cannot use MPS; install an arm64 Python")
    return Target(
        id=f"mac-{label}gib-unified",
        name=f"Mac with {label} GiB unified memory",
        backend="mps",
        memory_bytes=memory_bytes,
        usable_bytes=usable,
        headroom_bytes=0,
        budget_lines=lines,
        context_bytes=0,
        bf16=True,
        source="size given on the command line",
        notes=tuple(notes),
    )


def _working_set(memory_bytes: int, facts: AppleFacts | None) -> tuple[int, str]:
    if facts is not None and facts.recommended_max_bytes:
        return (
            facts.recommended_max_bytes,
            "Metal recommendedMaxWorkingSetSize (torch.mps.recommended_max_memory())",
        )
    if facts is not None and facts.wired_limit_mib:
        limit = min(memory_bytes, facts.wired_limit_mib * MIB)
        return limit, f"GPU wired limit set by sysctl iogpu.wired_limit_mb={facts.wired_limit_mib}"
    usable = memory_bytes * APPLE_USABLE_NUM // APPLE_USABLE_DEN
    return usable, "GPU working set: 75 % of unified memory (source documents: about three quarters)"


# -------------------------------------------------------------------------------------------- detected


def cpu_target(mem: CpuMemory) -> Target:
    """This machine's RAM: MemAvailable, capped by the container's cgroup limit."""
    steps = [
        BudgetLine(name="ram_total", bytes=mem.total_bytes, note="MemTotal"),
        BudgetLine(
            name="in_use",
            bytes=mem.available_bytes - mem.total_bytes,
            note="used by the OS and other processes",
        ),
    ]
    if mem.usable_bytes < mem.available_bytes:
        steps.append(
            BudgetLine(
                name="cgroup_limit",
                bytes=mem.usable_bytes - mem.available_bytes,
                note=f"container limit {fmt_gib(mem.cgroup_limit_bytes or 0)}, "
                f"{fmt_gib(mem.cgroup_used_bytes or 0)} already charged",
            )
        )
    lines = _usable_line(steps, mem.method)
    return Target(
        id="cpu",
        name="CPU (system RAM)",
        backend="cpu",
        memory_bytes=mem.total_bytes,
        usable_bytes=_positive(lines[-1].bytes, "cpu"),
        headroom_bytes=0,
        budget_lines=lines,
        context_bytes=0,
        bf16=True,
        detected=True,
        source=mem.method,
    )


def _need_cpu(mem: CpuMemory | None) -> CpuMemory:
    if mem is None:
        raise FitcheckError(
            "could not read this machine's memory; give --on a size instead, e.g. 24GB or 36GB-unified"
        )
    return mem


def target_from_detection(det: Detection, environ: dict[str, str] | None = None) -> Target:
    """The target `auto` resolves to: the detected GPU(s), the Mac, or system RAM."""
    environ = environ or {}
    if det.gpus and visible(det.gpus, environ):
        target = gpu_target(det.gpus, det.backend, environ)
        ram = det.cpu.total_bytes if det.cpu is not None else None
        return target.model_copy(update={"host_memory_bytes": ram})
    if det.apple is not None:
        return apple_target(det.apple)
    if not det.gpus:
        return cpu_target(_need_cpu(det.cpu))
    # every GPU hidden: a training process here would see none
    raw = clipped(repr(environ.get("CUDA_VISIBLE_DEVICES")), 40)
    hidden = f"CUDA_VISIBLE_DEVICES={raw} leaves none of the {len(det.gpus)} GPU(s) visible"
    if det.cpu is None:
        raise InputError(f"{hidden}, and this machine's memory could not be read; give --on, e.g. 24GB")
    cpu = cpu_target(det.cpu)
    return cpu.model_copy(update={"notes": (*cpu.notes, f"{hidden}: sized against this machine's RAM")})


def apple_target(facts: AppleFacts) -> Target:
    """A detected Mac: hw.memsize and the measured working set or wired limit when known."""
    entry = catalog.match_apple(facts.chip, facts.memory_bytes)
    base = unified_target(facts.memory_bytes, facts)
    return base.model_copy(
        update={
            "id": entry.id if entry else base.id,
            "name": f"{facts.chip} ({facts.memory_bytes / GIB:g} GiB)",
            "detected": True,
            "source": facts.method,
        }
    )


def visible_ordinals(raw: str) -> list[int] | None:
    """The device ordinals CUDA reads from ``CUDA_VISIBLE_DEVICES`` (as ``torch.cuda._parse_visible_devices``
    mirrors it, torch 2.13): each entry read like ``strtoul`` (``1gpu`` is 1), an entry that is negative or
    no number ends the list (``""`` and ``-1`` hide every GPU), a repeated ordinal empties it. None for UUIDs
    (``GPU-...``, ``MIG-...``), which this reading does not resolve."""
    if raw.startswith(("GPU-", "MIG-")):
        return None
    out: list[int] = []
    for elem in raw.split(","):
        digits = re.match(r"[+-]?[0-9]+", elem.strip(), re.ASCII)
        x = int(digits.group()) if digits else -1
        if x in out:
            return []
        if x < 0:
            break
        out.append(x)
    return out


def visible(gpus: Sequence[GpuDevice], environ: dict[str, str]) -> list[GpuDevice]:
    """GPUs selected by CUDA_VISIBLE_DEVICES, in its order (UUIDs and MIG ids: all kept). An ordinal no GPU
    has ends the list, as CUDA trims it; GPUs torch found are already the visible ones, renumbered from 0."""
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    wanted = None if raw is None else visible_ordinals(raw)
    if wanted is None or any(g.method.startswith("torch") for g in gpus):
        return list(gpus)
    by_index = {g.index: g for g in gpus}
    out: list[GpuDevice] = []
    for i in wanted:
        if i not in by_index:
            break
        out.append(by_index[i])
    return out


def gpu_target(gpus: Sequence[GpuDevice], backend: Backend, environ: dict[str, str]) -> Target:
    """Detected GPUs: identical cards count as data-parallel copies sized by the fullest one;
    mixed cards: the one with the most free memory, the others noted."""
    shown = visible(gpus, environ) or list(gpus)
    groups: dict[tuple[str, int], list[GpuDevice]] = {}
    for g in shown:
        groups.setdefault((g.name, g.total_bytes), []).append(g)
    notes: list[str] = []
    if len(groups) == 1:
        same = next(iter(groups.values()))
        device = min(same, key=_free)
        count = len(same)
        if count > 1:
            notes.append(
                f"{count} identical GPUs: sized by the one with the least free memory (GPU {device.index})"
            )
    else:
        device = max(shown, key=_free)
        count = 1
        others = ", ".join(
            f"GPU {g.index} {g.name} ({fmt_gib(_free(g))} free)" for g in shown if g is not device
        )
        notes.append(
            f"mixed GPUs: sized for GPU {device.index}, the one with the most free memory; "
            f"also here: {others}"
        )
    return _device_target(device, backend, count, notes)


def _free(g: GpuDevice) -> int:
    if g.free_bytes is not None:
        return g.free_bytes
    return g.total_bytes - (g.used_bytes or 0) - (g.reserved_bytes or 0)


def _device_target(device: GpuDevice, backend: Backend, count: int, notes: list[str]) -> Target:
    entry = catalog.match_gpu(device.name, device.total_bytes, device.vendor)
    if device.mig_enabled and device.mig_instances:
        lines, memory = _mig_lines(device, notes)
    else:
        lines, memory = _gpu_lines(device, entry), device.total_bytes
    if device.display_active:
        notes.append("this GPU drives a display: desktop apps can take more memory while you train")
    context_mib = entry.context_mib if entry else _generation_context(device, backend)
    return Target(
        id=entry.id if entry else f"detected-{backend}",
        name=(f"{count} x " if count > 1 else "") + device.name,
        backend=backend,
        gpus=count,
        memory_bytes=memory,
        usable_bytes=_positive(lines[-1].bytes, device.name),
        headroom_bytes=0,
        budget_lines=lines,
        context_bytes=context_mib * MIB,
        bf16=_bf16(device, entry),
        detected=True,
        source=device.method,
        notes=(*notes, _context_note(context_mib, backend)),
    )


def _generation_context(device: GpuDevice, backend: str) -> int:
    if backend == "cuda" and device.compute_capability and float(device.compute_capability) >= 10:
        return 555  # Blackwell: bare context measured at 555 MiB (github.com/ggml-org/llama.cpp/pull/23604)
    if backend == "cuda" and device.compute_capability and int(float(device.compute_capability)) == 9:
        return HOPPER_CONTEXT_MIB  # measured at a training step's peak on an H200 (facts/context.py)
    return DEFAULT_CONTEXT_MIB[backend]


def _bf16(device: GpuDevice, entry: HardwareEntry | None) -> bool:
    if device.compute_capability:
        return float(device.compute_capability) >= 8.0
    return entry.bf16_supported if entry else True


def _gpu_lines(device: GpuDevice, entry: HardwareEntry | None) -> tuple[BudgetLine, ...]:
    total = device.total_bytes
    lines = [BudgetLine(name="device_memory", bytes=total, note=f"{device.method}: total")]
    if device.free_bytes is not None:
        used = device.used_bytes or 0
        reserved = total - used - device.free_bytes
        reported = (
            f", reports {device.reserved_bytes // MIB} MiB" if device.reserved_bytes is not None else ""
        )
        lines.append(
            BudgetLine(
                name="driver_reserved",
                bytes=-reserved,
                note=f"total - used - free (driver{reported}; MiB rounding)",
            )
        )
        lines.append(
            BudgetLine(name="other_processes", bytes=-used, note="memory.used: other processes, desktop")
        )
        return _usable_line(lines, "free memory now, as the driver reports it")
    if device.used_bytes is not None:
        lines.append(
            BudgetLine(name="other_processes", bytes=-device.used_bytes, note="used, as the tool reports it")
        )
        return _usable_line(lines, "total - used (the tool reports no free figure)")
    idle = (
        entry.idle_used_mib if entry and entry.idle_used_mib is not None else DEFAULT_IDLE_MIB["consumer"]
    ) * MIB
    lines.append(BudgetLine(name="idle_use", bytes=-idle, note="no usage reported: typical idle use assumed"))
    return _usable_line(lines, "total - typical idle use")


def _mig_lines(device: GpuDevice, notes: list[str]) -> tuple[tuple[BudgetLine, ...], int]:
    """Size against MIG device 0: CUDA enumerates one MIG device, the first, unless told otherwise."""
    inst = device.mig_instances[0]
    profile = f" {inst.profile}" if inst.profile else ""
    others = ", ".join(f"{m.profile or m.index} ({fmt_gib(m.total_bytes)})" for m in device.mig_instances[1:])
    notes.append(
        f"GPU {device.index} is in MIG mode: sized against MIG device 0{profile}, the slice a CUDA "
        "process sees by default (pick another with CUDA_VISIBLE_DEVICES=MIG-<uuid>)"
        + (f"; other slices: {others}" if others else "")
    )
    used = inst.used_bytes or 0
    free = inst.free_bytes if inst.free_bytes is not None else inst.total_bytes - used
    lines = _usable_line(
        (
            BudgetLine(
                name="mig_slice",
                bytes=inst.total_bytes,
                note=f"MIG device 0{profile} of GPU {device.index} (nvidia-smi -q)",
            ),
            BudgetLine(
                name="other_processes",
                bytes=free - inst.total_bytes,
                note="used in the slice (incl. MiB rounding)",
            ),
        ),
        "free memory of the MIG slice",
    )
    return lines, inst.total_bytes


#: ``plan --on none``: a budget no run reaches (1 PiB), so every configuration is judged by speed only.
UNLIMITED_BYTES = 1 << 50


def unlimited_target(backend: Backend = "cuda") -> Target:
    """``--on none`` for ``plan``: no memory limit (the plan ranks by speed on the backend's assumed
    device; its ``min_device_bytes`` is the least memory any configuration needs)."""
    return Target(
        id="none",
        name="no target (no memory limit)",
        backend=backend,
        memory_bytes=UNLIMITED_BYTES,
        usable_bytes=UNLIMITED_BYTES,
        headroom_bytes=0,
        context_bytes=DEFAULT_CONTEXT_MIB[backend] * MIB if backend in DEFAULT_CONTEXT_MIB else 0,
        source="--on none",
        notes=("--on none: no memory limit; name a device (--on rtx-4090, 24GB) for a verdict",),
    )
