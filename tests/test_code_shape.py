"""The shape the package's code keeps, so it stays readable in an afternoon: no function over 80
lines, and no C++ assembled in a long f-string (kernel skeletons are templates in .cuh files; Python
emits only the per-region expressions and a short instantiation stub)."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "torch_htam"
MAX_FUNCTION_LINES = 80
MAX_FSTRING_LINES = 15


def _nodes(kind):
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, kind):
                yield path.relative_to(PACKAGE.parent), node


def _lines(node) -> int:
    return node.end_lineno - node.lineno + 1


def test_no_function_is_longer_than_the_limit():
    long = [f"{p}:{n.lineno} {n.name} ({_lines(n)} lines)"
            for p, n in _nodes((ast.FunctionDef, ast.AsyncFunctionDef)) if _lines(n) > MAX_FUNCTION_LINES]
    assert not long, long


def test_no_fstring_is_longer_than_the_limit():
    # an f-string is one ast.JoinedStr, implicit concatenation of adjacent f-strings included
    long = [f"{p}:{n.lineno} ({_lines(n)} lines)" for p, n in _nodes(ast.JoinedStr) if _lines(n) > MAX_FSTRING_LINES]
    assert not long, long
