"""TRL 1.16's fused LM head (``--loss trl``; engine/loss.py ``_trl``): TRL's own ``ChunkedLogProbFunction``
run on a real CPU step under fitcheck's storage tracker. The Triton folds CUDA runs write the tile and the
per-token rows in place and allocate nothing, and on CUDA ``_addmm_fp32`` is one ``addmm`` with
``out_dtype`` into the fp32 accumulator; the CPU fallbacks of those three allocate temporaries of their
own, so they are replaced by allocation-free stand-ins here, and every other allocation is TRL's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fitcheck.cli import main
from fitcheck.engine.loss import Dims, _trl

torch = pytest.importorskip("torch")
chunked = pytest.importorskip("trl.kernels.chunked_logprob")


def _traced(n: int, vocab: int, hidden: int, dtype: object, head: bool = False) -> tuple[int, int]:
    from fitcheck.measure.tracker import LiveStorageMode, Tracker

    torch.manual_seed(0)
    full = torch.randn(n + 7, hidden, dtype=dtype, requires_grad=True)  # the backbone's last hidden states
    weight = (torch.randn(vocab, hidden, dtype=dtype) * 0.02).requires_grad_(head)  # a trained lm_head
    labels = torch.randint(0, vocab, (n + 7,))
    labels[:7] = -100
    t = Tracker()
    with LiveStorageMode(t):
        t.begin("forward", 1)
        base = t.live_bytes
        mask = labels != -100
        out = chunked.ChunkedLogProbFunction.apply(  # the compact (CUDA) path of add_fused_lm_head
            full[mask], weight, None, labels[mask], 1.0, 32768, None, 1.0, ("log_probs", "entropy", "is_top1")
        )
        loss = -out[0].sum() / n
        fwd = t.windows[-1].peak_bytes - base
        t.begin("backward", 1)
        loss.backward()
        bwd = t.windows[-1].peak_bytes - base
        t.end()
    return fwd, bwd


@pytest.mark.parametrize(
    ("n", "vocab", "hidden", "dtype", "gamma"),
    [
        (5000, 40000, 64, "bfloat16", 2),  # two token tiles, two vocabulary tiles
        (1000, 50000, 256, "bfloat16", 2),
        (9000, 1000, 512, "float32", 4),  # a vocabulary below one tile: the buffer is still 32768 wide
    ],
)
def test_the_fused_head_holds_what_the_kernel_counts(
    monkeypatch: pytest.MonkeyPatch, n: int, vocab: int, hidden: int, dtype: str, gamma: int
) -> None:
    for name in ("_forward_tile", "_backward_tile", "_addmm_fp32"):
        monkeypatch.setattr(chunked, name, lambda *a, **k: None)
    fwd, bwd = _traced(n, vocab, hidden, getattr(torch, dtype))
    hump = _trl(Dims(n, vocab, hidden, gamma, 0, 1))
    assert hump.forward == pytest.approx(fwd, rel=0.001)
    assert hump.backward == pytest.approx(bwd, rel=0.001)
    # a trained lm_head (full fine-tuning): the kernel's fp32 weight-gradient accumulator, beside the
    # gradient it returns (counted with the model's gradients, not in the hump)
    _, bwd = _traced(n, vocab, hidden, getattr(torch, dtype), head=True)
    head_grad = 4 * vocab * hidden if gamma != 4 else 0  # an fp32 head's accumulator is its gradient
    hump = _trl(Dims(n, vocab, hidden, gamma, 0, 1, head_grad=head_grad))
    assert hump.backward + vocab * hidden * gamma == pytest.approx(bwd, rel=0.001)


def test_the_kernels_tile_is_trls() -> None:
    from fitcheck.engine import loss

    assert chunked.TOKEN_CHUNK_SIZE == loss.TRL_TILE_TOKENS
    utils = pytest.importorskip("trl.trainer.utils")
    assert utils._CHUNKED_LOGPROB_CHUNK_SIZE == loss.TRL_TILE_VOCAB


def _read_loss(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> str:
    path = tmp_path / "sft.yaml"
    path.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nuse_peft: true\n" + text)
    assert main(["estimate", "qwen2.5-0.5b", "--from", str(path), "--on", "none", "--format", "json"]) == 0
    loss: str = json.loads(capsys.readouterr().out)["setup"]["loss"]
    return loss


@pytest.mark.parametrize(
    ("text", "loss"),
    [
        ("max_length: 1024\n", "trl"),  # SFTTrainer's own: the fused LM head
        ("max_length: 1024\nloss_type: dft\n", "trl"),
        ("max_length: 1024\nuse_liger_kernel: true\n", "trl"),  # TRL 1.16 turns Liger's fused CE off
        ("max_length: 1024\nlabel_smoothing_factor: 0.1\n", "standard"),  # the LabelSmoother: whole logits
        # max_seq_length (renamed max_length in TRL 0.20): that trainer made the whole logits, or ran
        # Liger's fused cross-entropy when asked
        ("max_seq_length: 1024\n", "standard"),
        ("max_seq_length: 1024\nuse_liger_kernel: true\n", "liger"),
    ],
)
def test_a_trl_file_poses_the_loss_its_trl_runs(
    text: str, loss: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _read_loss(tmp_path, text, capsys) == loss
