"""No function in src/fitcheck runs past a screen: 60 body lines, the docstring not counted (issue 9, item 6).

A long function is split into named steps a newcomer can read one at a time. There are no exceptions
(the allowlist is empty; a path put on it must exist and say why in a comment).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[1] / "src" / "fitcheck"
MAX_BODY_LINES = 60
#: Paths (relative to src/fitcheck) exempted, a folder ending in "/": none.
ALLOWED: tuple[str, ...] = ()

Function = ast.FunctionDef | ast.AsyncFunctionDef


def body_lines(fn: Function) -> int:
    """Lines from the first statement after the docstring to the function's last line."""
    body = fn.body
    first = body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        if len(body) == 1:
            return 0
        first = body[1]
    end = fn.end_lineno or fn.lineno
    return end - first.lineno + 1


def long_functions(source: str, limit: int = MAX_BODY_LINES) -> list[tuple[str, int, int]]:
    """(name, line, body lines) of every function or method in ``source`` longer than ``limit``."""
    tree = ast.parse(source)
    return [
        (node.name, node.lineno, body_lines(node))
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and body_lines(node) > limit
    ]


def allowed(rel: str) -> bool:
    return any(rel == a or (a.endswith("/") and rel.startswith(a)) for a in ALLOWED)


def test_the_measure_counts_body_lines_without_the_docstring() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    src = f'def f():\n    """Doc\n\n    more doc.\n    """\n{body}\n'
    assert long_functions(src) == [("f", 1, 61)]
    short = "\n".join(f"    x{i} = {i}" for i in range(60))
    assert long_functions(f'def g():\n    """Doc."""\n{short}\n') == []
    nested = "class C:\n    def m(self):\n        def inner():\n" + "\n".join(
        f"            y{i} = {i}" for i in range(61)
    )
    assert [name for name, _, _ in long_functions(nested + "\n")] == ["m", "inner"]


def test_no_function_over_sixty_lines() -> None:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 50
    offenders = []
    for path in files:
        rel = path.relative_to(SRC).as_posix()
        if allowed(rel):
            continue
        offenders += [
            f"{rel}:{line} {name} ({n} lines)" for name, line, n in long_functions(path.read_text())
        ]
    assert not offenders, "split these into named steps:\n" + "\n".join(offenders)


def test_the_allowlist_names_only_existing_paths() -> None:
    for a in ALLOWED:
        assert (SRC / a).exists(), f"{a} is gone: take it off the allowlist"
