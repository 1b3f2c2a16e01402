"""Hostile inputs, second red-team pass (session 5): one parametrized test per class that failed.

- a bound a request model declares (``PlanRequest.batch_size >= 1``) but no option validator checked
  reached the user as pydantic's internal error: ``plan 7B --batch-size 0`` (found by the CLI fuzz test,
  seed 7). Every request model is now built through `fitcheck.api.validated`.
"""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import pytest

from fitcheck.cli import main


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def assert_one_line(rc: int, out: str, err: str, word: str) -> None:
    assert rc == 2, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fitcheck: error:"), err
    assert "internal error" not in err and word in lines[0], err


@pytest.mark.parametrize(
    ("option", "value"),
    [("--batch-size", "0"), ("--batch-size", "-3"), ("--effective-batch", "0"), ("--min-seq-len", "0"),
     ("--epochs", "0"), ("--seq-len", "0")],
)  # fmt: skip
def test_a_plan_request_out_of_range_is_one_line_naming_its_flag(option: str, value: str) -> None:
    assert_one_line(*run(["plan", "7B", option, value, "--on", "rtx-4090"]), option)
