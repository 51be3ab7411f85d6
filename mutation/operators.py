"""Mutation operators: where a lifecycle bug could be written, found from the AST.

Each operator walks one module's syntax tree and yields ``Site``s, one per
change it can make. A site knows how to produce the mutated module source, so
a mutant is fully described by (file, operator, ordinal), and the same code
always yields the same list, in the same order.

    release-call   delete one statement that calls a release-type method
                   (free, release, unlock, dec, close*, forget, discard,
                   pop, remove, clear, drop_*, evict*) or ``del``s a key
    pop-to-get     ``d.pop(k[, v])`` whose value is used becomes ``d.get``:
                   the value is read but the entry stays
    unlock-to-dec  ``tree.unlock(node)`` (the whole path) becomes
                   ``tree.dec(node)`` (the node alone)
    slice-bound    move one bound of a slice of pages, tokens or slots by one,
                   down or up
    skip-cleanup   an ``except``/``finally`` block loses its work but keeps
                   its trailing ``raise``/``return``
    skip-branch    in an abort, error, close or finish path, one ``if``
                   branch is never taken (its test becomes ``False``)
    finally-to-except  a ``finally:`` block runs only when something raised
                   (``except Exception: ...; raise``): the normal path skips
                   the cleanup
    narrow-if      in such a path, an ``if`` also needs the test of the
                   ``if`` before it in the function (``if a:`` becomes
                   ``if a and b:``): a condition narrowed by an extra ``and``
    remove-early   a release-type statement swaps places with the call before
                   it: the registry entry goes before a call that can fail
    mutate-copy    ``x.append(v)`` (``add``, ``update``, ``extend``, ``insert``,
                   ``setdefault``) becomes ``x.copy().append(v)``: a copy is
                   changed where the original was meant
"""

from __future__ import annotations

import ast
import re
from typing import NamedTuple

RELEASE_NAMES = frozenset(
    {"free", "release", "unlock", "dec", "forget", "discard", "pop", "popleft", "remove", "clear"}
)
RELEASE_PREFIXES = ("close", "drop_", "release_", "free_", "evict", "forget_")
PAGED = re.compile(r"page|token|slot", re.IGNORECASE)
MUTATORS = frozenset({"append", "add", "update", "extend", "insert", "setdefault", "appendleft"})
# Functions whose branches are an abort, error or teardown path.
ERROR_PATH = re.compile(r"abort|cancel|fail|error|close|finish|release|retract|reap|disconnect")


class Site(NamedTuple):
    """One place one operator can change, and what it changes it into."""

    operator: str
    line: int
    before: str  # the source text it changes (one line, shortened)
    after: str

    @property
    def label(self) -> str:
        return f"{self.before}  ->  {self.after}"


def _is_release_call(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    name = node.func.attr
    return name in RELEASE_NAMES or name.startswith(RELEASE_PREFIXES)


def _text(node: ast.AST) -> str:
    text = ast.unparse(node).splitlines()[0]
    return text if len(text) <= 90 else text[:87] + "..."


class _Mutator(ast.NodeTransformer):
    """Visits a module in a fixed order; changes the ``target``-th site it meets
    (counting from 0), or none when ``target`` is -1, and records every site."""

    def __init__(self, target: int = -1) -> None:
        self.target = target
        self.sites: list[Site] = []
        self._functions: list[str] = []
        self._tests: list[list[ast.expr]] = []  # the if-tests seen so far, per function

    def _site(self, operator: str, node: ast.AST, before: str, after: str) -> bool:
        """Record a site; True when it is the one to change."""
        self.sites.append(Site(operator=operator, line=node.lineno, before=before, after=after))
        return len(self.sites) - 1 == self.target

    # -- scopes ---------------------------------------------------------------
    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        self._functions.append(node.name)
        self._tests.append([])
        self.generic_visit(node)
        self._tests.pop()
        self._functions.pop()
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def _in_error_path(self) -> bool:
        return any(ERROR_PATH.search(name) for name in self._functions)

    # -- release-call and del -------------------------------------------------
    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        if _is_release_call(node.value) and self._site("release-call", node, _text(node), "pass"):
            return ast.copy_location(ast.Pass(), node)
        call = node.value
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr in MUTATORS
            and isinstance(call.func.value, ast.Name | ast.Attribute)
        ):
            owner = call.func.value
            copied = f"{_text(owner)}.copy().{call.func.attr}("
            if self._site(
                "mutate-copy",
                node,
                _text(node),
                _text(node).replace(f"{_text(owner)}.{call.func.attr}(", copied, 1),
            ):
                call.func.value = ast.Call(
                    func=ast.Attribute(value=owner, attr="copy", ctx=ast.Load()),
                    args=[],
                    keywords=[],
                )
                return node
        self.generic_visit(node)
        return node

    def visit_Delete(self, node: ast.Delete) -> ast.AST:
        keyed = any(isinstance(t, ast.Subscript) for t in node.targets)
        if keyed and self._site("release-call", node, _text(node), "pass"):
            return ast.copy_location(ast.Pass(), node)
        return node

    # -- pop-to-get and unlock-to-dec ------------------------------------------
    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if not isinstance(func, ast.Attribute):
            return node
        if func.attr == "pop" and len(node.args) in (1, 2) and not node.keywords:
            if self._site(
                "pop-to-get", node, _text(node), _text(node).replace(".pop(", ".get(", 1)
            ):
                func.attr = "get"
        elif (
            func.attr == "unlock"
            and len(node.args) == 1
            and self._site(
                "unlock-to-dec", node, _text(node), _text(node).replace(".unlock(", ".dec(", 1)
            )
        ):
            func.attr = "dec"
        return node

    # -- slice-bound ----------------------------------------------------------
    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        """Only slices of page and token lists (``pages[a:b]``, ``tokens[:n]``)."""
        self.generic_visit(node)
        if isinstance(node.slice, ast.Slice) and PAGED.search(_text(node.value)):
            self._slice(node.slice)
        return node

    def _slice(self, node: ast.Slice) -> None:
        for bound in ("lower", "upper"):
            value = getattr(node, bound)
            if value is None:
                continue
            for delta in (-1, 1):
                op = ast.Sub() if delta < 0 else ast.Add()
                moved = ast.BinOp(left=value, op=op, right=ast.Constant(1))
                if self._site("slice-bound", value, f"{bound} {_text(value)}", _text(moved)):
                    setattr(node, bound, ast.copy_location(moved, value))

    # -- skip-cleanup and skip-branch ------------------------------------------
    def _skip_body(self, body: list[ast.stmt], node: ast.AST, what: str) -> list[ast.stmt] | None:
        work = body[:-1] if isinstance(body[-1], (ast.Raise, ast.Return)) else body
        if not work or all(isinstance(s, ast.Pass) for s in work):
            return None
        kept = body[len(work) :]
        if self._site("skip-cleanup", node, what, "; ".join(_text(s) for s in kept) or "pass"):
            return kept or [ast.copy_location(ast.Pass(), node)]
        return None

    def visit_Try(self, node: ast.Try) -> ast.AST:
        if node.finalbody and not node.handlers:
            first = node.finalbody[0]
            if self._site(
                "finally-to-except", first, "finally: ...", "except Exception: ...; raise"
            ):
                cleanup = [*node.finalbody, ast.copy_location(ast.Raise(), first)]
                handler = ast.ExceptHandler(type=ast.Name("Exception", ast.Load()), body=cleanup)
                node.handlers, node.finalbody = [ast.copy_location(handler, first)], []
        for handler in node.handlers:
            what = f"except {_text(handler.type) if handler.type else ''}: ...".replace(" :", ":")
            skipped = self._skip_body(handler.body, handler, what)
            if skipped is not None:
                handler.body = skipped
        if node.finalbody:
            skipped = self._skip_body(node.finalbody, node.finalbody[0], "finally: ...")
            if skipped is not None:
                node.finalbody = skipped
        self.generic_visit(node)
        return node

    def visit_If(self, node: ast.If) -> ast.AST:
        lifecycle = self._in_error_path() and not _is_fault_switch(node.test)
        before = self._tests[-1][-1] if self._tests and self._tests[-1] else None
        if self._tests:
            self._tests[-1].append(node.test)
        if lifecycle and self._site("skip-branch", node, f"if {_text(node.test)}:", "if False:"):
            node.test = ast.copy_location(ast.Constant(False), node.test)
        elif lifecycle and before is not None and _text(before) != _text(node.test):
            narrowed = ast.BoolOp(op=ast.And(), values=[node.test, before])
            if self._site("narrow-if", node, f"if {_text(node.test)}:", f"if {_text(narrowed)}:"):
                node.test = ast.copy_location(narrowed, node.test)
        self.generic_visit(node)
        return node

    # -- remove-early -----------------------------------------------------------
    def generic_visit(self, node: ast.AST) -> ast.AST:
        """Statement lists first get their remove-early sites (a release-type
        statement right after a statement that calls something), then the walk."""
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                self._remove_early(stmts)
        return super().generic_visit(node)

    def _remove_early(self, stmts: list[ast.stmt]) -> None:
        for i in range(1, len(stmts)):
            removal, call = stmts[i], stmts[i - 1]
            releases = isinstance(removal, ast.Delete) or (
                isinstance(removal, ast.Expr) and _is_release_call(removal.value)
            )
            calls = any(isinstance(n, ast.Call) for n in ast.walk(call))
            if releases and calls and not isinstance(call, ast.Return | ast.Raise):
                moved = f"{_text(removal)}; {_text(call)}"
                if self._site("remove-early", removal, f"{_text(call)}; {_text(removal)}", moved):
                    stmts[i - 1], stmts[i] = removal, call


def _is_fault_switch(test: ast.expr) -> bool:
    """``if Fault.X in self.faults``: the fault registry's own switches are not
    lifecycle branches (skipping one only turns a registered fault on or off)."""
    return "Fault." in ast.unparse(test)


def sites(source: str) -> list[Site]:
    """Every site in a module, in visiting order."""
    mutator = _Mutator()
    mutator.visit(ast.parse(source))
    return mutator.sites


def mutate(source: str, ordinal: int) -> str:
    """The module's source with its ``ordinal``-th site changed."""
    mutator = _Mutator(ordinal)
    tree = mutator.visit(ast.parse(source))
    if ordinal >= len(mutator.sites):
        raise IndexError(f"the module has {len(mutator.sites)} sites, not {ordinal + 1}")
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


OPERATORS: tuple[str, ...] = (
    "release-call",
    "pop-to-get",
    "unlock-to-dec",
    "slice-bound",
    "skip-cleanup",
    "skip-branch",
    "finally-to-except",
    "narrow-if",
    "remove-early",
    "mutate-copy",
)
