"""The private torch/transformers internals of the tracers (``fitcheck.measure._internals``) and one
LLM calibration record re-traced (the diffusion one is in tests/test_diffusion_calibration.py).

When torch, transformers, peft or diffusers is upgraded beyond `CHECKED_ON`, these tests are the
check: every internal still resolves, and a traced record still gives the same bytes.
"""

from __future__ import annotations

import re
import tomllib
import warnings
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from fitcheck.measure import _internals  # noqa: E402
from fitcheck.models import LlmSetup  # noqa: E402

ROOT = Path(__file__).parent.parent


def test_checked_versions_are_named_and_inside_the_pins() -> None:
    """torch 2.13.0, transformers 5.24.0, peft 0.21.2, diffusers 0.42.1; each within pyproject's range."""
    assert _internals.CHECKED_ON == {
        "torch": "2.13.0",
        "transformers": "5.24.0",
        "peft": "0.21.2",
        "diffusers": "0.42.1",
    }
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = {re.split(r"[<>=!]", r)[0]: r for reqs in extras.values() for r in reqs}
    for name, version in _internals.CHECKED_ON.items():
        spec = pins[name]
        low = re.search(r">=([\d.]+)", spec)
        high = re.search(r"<([\d.]+)", spec)
        assert low and high, f"{name}: pin a tested range, not {spec!r}"
        v = tuple(int(x) for x in version.split("."))
        assert (
            tuple(int(x) for x in low.group(1).split("."))
            <= v
            < tuple(int(x) for x in high.group(1).split("."))
        )


def test_installed_versions_were_checked() -> None:
    """torch is pinned exactly by the install instructions; other releases inside the pins warn."""
    import peft
    import transformers

    installed = {"transformers": transformers.__version__, "peft": peft.__version__}
    assert torch.__version__.split("+")[0] == _internals.CHECKED_ON["torch"]
    for name, version in installed.items():
        if version != _internals.CHECKED_ON[name]:
            warnings.warn(
                f"{name} {version}: the tracer internals were checked on {_internals.CHECKED_ON[name]}",
                stacklevel=1,
            )


def test_every_internal_resolves() -> None:
    from fitcheck.measure.autocast import cuda_autocast_policy

    assert callable(_internals.grouped_mm_gate())
    assert _internals.current_autograd_node() is None  # not in backward
    with _internals.exclude_autocast_cpu():
        pass
    with cuda_autocast_policy() as added:  # registers and destroys a Library: both internals
        assert "mse_loss" in added or _internals.has_autocast_cpu_kernel(torch.ops.aten.mse_loss.default)
    lin = torch.nn.Linear(2, 2)
    tied = torch.nn.ModuleList([lin, lin])
    assert len(_internals.unique_params(tied)) == 2 and _internals.param_bytes(tied) == 24
    with torch.device("meta"):
        meta = torch.nn.Linear(4, 4)
    fake = _internals.FakeTensorMode()
    _internals.fakeify(meta, fake)
    assert meta.weight.device.type == "cpu" and isinstance(meta.weight, torch.nn.Parameter)
    assert issubclass(_internals.TorchDispatchMode, object)


@pytest.mark.slow
def test_retrace_one_llm_record() -> None:
    """The reference itself: re-trace a small GPT-2 LoRA record and get the same bytes, every phase."""
    from fitcheck.measure.trace import trace_step

    data = yaml.safe_load((ROOT / "tests" / "data" / "calibration" / "gpt2.yaml").read_text())
    records = data["records"] if isinstance(data, dict) else data
    rec = next(r for r in records if r["id"] == "gpt2-05")
    traced = rec["measured"]
    step = trace_step(rec["hf_config"], LlmSetup(**rec["setup"]), steps=traced["steps"])
    assert step.peak_allocated_bytes == traced["peak_allocated_bytes"]
    assert [(p.name, p.peak_bytes) for p in step.phases] == [
        (p["name"], p["peak_bytes"]) for p in traced["phases"]
    ]
