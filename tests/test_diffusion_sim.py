"""The autograd simulator's rules, on hand-computable graphs (exact bytes)."""

from __future__ import annotations

from fitcheck.diffusion.sim import ops
from fitcheck.diffusion.sim.core import Param, Sim, simulating
from fitcheck.diffusion.sim.nn import Conv2d, Linear

N, D = 1024, 256  # tokens, width


def _run(fn, grad_input: bool = True):  # type: ignore[no-untyped-def]
    """Forward ``fn(x)``, then backward; returns (live bytes after forward, sim)."""
    s = Sim()
    with simulating(s):
        s.begin("forward")
        x = s.new((1, N, D), "bf16")
        x.rg = grad_input
        y = fn(x)
        after = s.live - x.st.nbytes - y.st.nbytes  # what the graph saved beyond input and output
        loss = ops.mean_all(ops.to(y, "fp32"))
        del y
        s.begin("backward")
        if loss.fn is not None:
            s.backward(loss)
        del loss, x
    return after, s


def _linear(trainable: bool, dtype: str = "bf16") -> Linear:
    lin = Linear(D, D, bias=False)
    lin.weight.dtype, lin.weight.trainable = dtype, trainable
    return lin


def test_frozen_linear_saves_no_input() -> None:
    lin = _linear(False)
    saved, _ = _run(lambda x: lin(x))
    assert saved == 0  # the weight is saved, but it is a parameter (no new storage)


def test_trained_linear_saves_its_input_without_copying() -> None:
    lin = _linear(True)
    saved, s = _run(lambda x: lin(x))
    assert saved == 0  # the saved input is x itself
    assert s.param_grads and s.live == D * D * 2  # after backward: only the weight's gradient


def test_frozen_conv_saves_its_input() -> None:
    """pytorch#133566: convolutions keep their input even with a frozen weight."""
    conv = Conv2d(8, 8, 3, padding=1)
    for p in (conv.weight, conv.bias):
        assert p is not None
        p.dtype = "bf16"
    s = Sim()
    with simulating(s):
        x = s.new((1, 8, 16, 16), "bf16")
        x.rg = True
        y = conv(x)
        node = y.fn
        assert node is not None and [st.nbytes for st in node.saved] == [8 * 16 * 16 * 2]


def test_autocast_layer_norm_keeps_an_fp32_copy() -> None:
    s = Sim()
    with simulating(s), s.autocasting("bf16"):
        x = s.new((1, N, D), "bf16")
        x.rg = True
        y = ops.layer_norm(x, None, None)
        assert y.dtype == "fp32"
        assert y.fn is not None
        assert sorted(st.nbytes for st in y.fn.saved) == [4 * N, 4 * N, 4 * N * D]


def test_autocast_caches_trained_fp32_weights_once() -> None:
    lin = _linear(True, "fp32")
    s = Sim()
    with simulating(s), s.autocasting("bf16"):
        x = s.new((1, N, D), "bf16")
        y1, y2 = lin(x), lin(x)
        assert len(s.cache) == 1 and y1.dtype == "bf16"
        del y1, y2
    assert not s.cache


def test_eager_attention_keeps_scores() -> None:
    from fitcheck.diffusion.arch.common import Run, attention

    s = Sim()
    with simulating(s), s.autocasting("bf16"):
        q = s.new((1, N, D), "bf16")
        q.rg = True
        live0 = s.live
        out = attention(q, q, q, heads=4, run=Run("eager"))
        scores = s.cats.get("attention_scores", 0)
        assert scores == 4 * N * N * (4 + 2)  # fp32 softmax + bf16 copy per head
        del out
        sdpa = attention(q, q, q, heads=4, run=Run("sdpa"))
        assert s.live - live0 - scores < 4 * N * N  # O(N): output and logsumexp only
        del sdpa


def test_checkpoint_keeps_inputs_and_recomputes() -> None:
    w = [_linear(True) for _ in range(4)]

    def chain(x):  # type: ignore[no-untyped-def]
        for lin in w:
            x = ops.gelu(lin(x))
        return x

    plain, _ = _run(chain)

    def ckpt(x):  # type: ignore[no-untyped-def]
        s = s_ckpt_holder[0]
        with s.checkpoint(x):
            return chain(x)

    s_ckpt_holder: list[Sim] = []
    s2 = Sim()
    s_ckpt_holder.append(s2)
    with simulating(s2):
        s2.begin("forward")
        x = s2.new((1, N, D), "bf16")
        x.rg = True
        y = ckpt(x)
        saved = s2.live - x.st.nbytes - y.st.nbytes
        loss = ops.mean_all(ops.to(y, "fp32"))
        del y
        s2.begin("backward")
        s2.backward(loss)
        del loss, x
    assert saved == 0 < plain  # only the (already counted) input is kept
    assert s2.phases["backward"].peak >= plain  # the recompute rebuilds what the chain saves


def test_backward_frees_everything_but_parameter_gradients() -> None:
    lin = _linear(True)
    _, s = _run(lambda x: ops.gelu(lin(x)))
    assert s.live == D * D * 2 and set(k for k, v in s.cats.items() if v) == {"gradients"}


def test_parameters_are_not_storages() -> None:
    """Weights, their gradients and states are model states, counted from the regime."""
    s = Sim()
    with simulating(s):
        t = ops.param(Param((3, 4)))
    assert t.st is None and s.live == 0 and t.numel == 12
