"""The prose wrapper (render._wrap): lines fit, values stay whole, nothing is lost."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from rich.cells import cell_len

from fitcheck.render import _VALUE, _wrap

WORDS = st.sampled_from(
    ["the", "estimate", "is", "over", "budget;", "likely", "(usable", "minus", "headroom)"]
)
VALUES = st.builds(
    lambda n, unit: f"{n:,.2f} {unit}",
    st.floats(min_value=0, max_value=1e6, allow_nan=False),
    st.sampled_from(["GiB", "MiB", "tokens", "B/token", "px"]),
)
TEXT = st.lists(st.one_of(WORDS, VALUES), min_size=1, max_size=40).map(" ".join)


@given(TEXT, st.integers(min_value=20, max_value=120), st.integers(min_value=0, max_value=4))
def test_wrapped_lines_fit_and_keep_values_whole(text: str, width: int, indent: int) -> None:
    lines = [line.plain for line in _wrap(text, width, indent)]
    for line in lines:  # a line runs over only when it is one unbreakable word or value
        body = line.strip()
        over = cell_len(line) > max(20, width)
        assert not over or " " not in body or _VALUE.fullmatch(body), line
    assert " ".join(line.strip() for line in lines) == text  # nothing lost, nothing added
    joined_values = [m.group() for m in _VALUE.finditer(text)]
    shown = [m.group() for line in lines for m in _VALUE.finditer(line)]
    assert shown == joined_values  # every value appears whole on one line
