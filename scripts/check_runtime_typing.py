"""Find typing syntax that Python 3.8 cannot evaluate, outside annotations (a complement to vermin).

With ``from __future__ import annotations`` annotations are strings and may use ``X | None`` and
``list[int]`` freely, and vermin (without --eval-annotations) rightly ignores them. But vermin also misses
the same syntax where it *is* evaluated: module-level type aliases, ``cast(list[int], x)``,
``isinstance(x, int | str)``, default factories. This script reports those:

- a subscripted builtin (``list[int]``, ``tuple[...]``, ``dict``, ``set``, ``frozenset``, ``type``) or
  ``collections.abc`` name (``Callable[...]``, ``Sequence[...]``): needs 3.9;
- ``X | Y`` where one side is ``None``, a builtin type, a typing/collections.abc name, a CapWords (class)
  name or a subscripted generic: needs 3.10.

Usage: ``python scripts/check_runtime_typing.py edgert`` (exit 1 when it finds any).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

BUILTIN_GENERICS = {"list", "dict", "tuple", "set", "frozenset", "type"}
BUILTIN_TYPES = BUILTIN_GENERICS | {"int", "float", "str", "bytes", "bool", "complex", "object"}


class _Checker(ast.NodeVisitor):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.abc_names: set[str] = set()
        self.typing_names: set[str] = set()
        self.problems: list[str] = []

    # annotations are not evaluated: skip them
    def visit_arg(self, node: ast.arg) -> None:
        pass

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for d in node.decorator_list:
            self.visit(d)
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)
        for stmt in node.body:
            self.visit(stmt)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module == "collections.abc":
            self.abc_names.update(a.asname or a.name for a in node.names)
        elif node.module == "typing":
            self.typing_names.update(a.asname or a.name for a in node.names)

    def _is_abc(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.abc_names
        return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and isinstance(node.value.value, ast.Name) and node.value.value.id == "collections"
                and node.value.attr == "abc")

    def _generic_subscript(self, node: ast.expr) -> bool:
        return isinstance(node, ast.Subscript) and (
            (isinstance(node.value, ast.Name) and node.value.id in BUILTIN_GENERICS) or self._is_abc(node.value))

    def _typeish(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Constant) and node.value is None:
            return True
        if isinstance(node, ast.Name):
            # a CapWords name is taken for a class (``Event = Segment | Transcript`` broke edgert on 3.9);
            # ALL_CAPS names are constants, where ``|`` is a flag or set union
            class_like = node.id[:1].isupper() and not node.id.isupper()
            return class_like or node.id in BUILTIN_TYPES or node.id in self.typing_names or node.id in self.abc_names
        if isinstance(node, ast.Subscript):
            return self._generic_subscript(node) or (
                isinstance(node.value, ast.Name) and node.value.id in self.typing_names)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self._typeish(node.left) or self._typeish(node.right)
        return False

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if self._generic_subscript(node):
            self.problems.append(f"{self.path}:{node.lineno}: {ast.unparse(node)}: subscripted at run time "
                                 "(Python 3.9+); use typing.List/Tuple/Callable or a string")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.BitOr) and (self._typeish(node.left) or self._typeish(node.right)):
            self.problems.append(f"{self.path}:{node.lineno}: {ast.unparse(node)}: a union evaluated at run time "
                                 "(Python 3.10+); use typing.Optional/Union or a tuple of types")
            return
        self.generic_visit(node)


def check(path: Path) -> list[str]:
    checker = _Checker(path)
    checker.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return checker.problems


def main(argv: list[str]) -> int:
    problems: list[str] = []
    for arg in argv or ["edgert"]:
        root = Path(arg)
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            problems.extend(check(path))
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
