"""How good are the exercise checks? Plant mutants in every exercise's worked solution and count
how many the check catches.

    python tools/mutation_probe.py                    # every chapter
    python tools/mutation_probe.py 04 12 --max 40     # some chapters, at most 40 mutants an exercise
    python tools/mutation_probe.py 07 --list          # print the mutants
    python tools/mutation_probe.py 12 --stubs         # every check rejects the student edition's stub

For each chapter the probe runs the notebook's code cells in one in-process IPython shell, in order,
up to its last exercise check (matplotlib on the Agg backend, every check passing as the chapter
stores it). At each exercise cell (the code between ``# BEGIN SOLUTION`` and ``# END SOLUTION``
lines: what a learner writes) it first makes the mutants of that code, one small change each, the
kind a learner makes by accident:

* an arithmetic operator replaced (``+`` / ``-``, ``*`` / ``/``, ``//`` -> ``/``, ``**`` -> ``*``,
  ``@`` -> ``*``), a comparison replaced (``<`` / ``<=``, ``>`` / ``>=``, ``==`` / ``!=``, ``<`` / ``>``),
  ``and`` / ``or``, ``min`` / ``max`` (the builtins, ``torch.min/max``, ``minimum/maximum``, ``amin``
  / ``amax``, ``clamp(min=...)`` / ``clamp(max=...)``);
* an operand left out (``a + b`` -> ``a``, -> ``b``), a unary minus dropped;
* an integer constant off by one (``n`` -> ``n + 1``, ``n - 1``), a float constant scaled by 10, a
  boolean flipped (``keepdim=True`` -> ``False``, ``unbiased=False`` -> ``True``);
* an axis changed (``dim=-1`` -> ``dim=0``; an integer ``dim``/``axis`` keyword off by one is above);
* argument order: two neighbouring positional arguments of a call swapped (not for commutative
  calls such as ``torch.max(a, b)``), or the values of two neighbouring keyword arguments
  (``beta_fast=a, beta_slow=b`` -> ``beta_fast=b, beta_slow=a``); a ``.detach()``, ``.float()``,
  ``.clone()``, ``.item()``... call removed (the object itself kept);
* boundary constants: a float constant divided by 10 as well as multiplied (``-1e9`` -> ``-1e10``
  and ``-1e8``), an integer constant of size 8 or more doubled and halved (``64`` -> ``128``, ``32``);
* a fallback dropped: ``a or b`` -> ``a``, ``d.get(key, default)`` -> ``d.get(key)``,
  ``getattr(obj, name, default)`` -> ``getattr(obj, name)``;
* sort direction: ``sort``, ``argsort``, ``sorted`` and ``topk`` given the other direction
  (``descending=True`` added, ``reverse=True`` added, ``largest=False`` added; a direction already
  written as a constant is flipped by the boolean operator above);
* a flag left at its default: a keyword argument whose value is a constant removed
  (``ensure_ascii=False``, ``keepdim=True``, ``descending=True``, ``eps=1e-6`` ...);
* a dropped special case: an ``if`` statement without ``else`` deleted, the ``if`` branch of one
  with ``else`` never taken (its test replaced by ``False``), ``a if c else b`` -> ``b``;
* one statement of the block deleted (an assignment, an augmented assignment, a bare call).

Each mutant runs in a copy of the chapter's namespace: the mutated cell, then the exercise's check
cell. It is **caught** when that raises (the check's ``AssertionError``, or the mutated cell itself
failing), or runs longer than ``--timeout`` seconds (a loop that no longer ends); it **survives** when
the check passes. A survivor is either a gap in the check or a mutant that computes the same answer
(an equivalent mutant): ``--list`` prints them to look at.

The report gives, per exercise, the mutants made, caught and the share, and the total. Numbers
depend only on the notebooks and the checks (the mutants are made deterministically, and the
sample drawn when an exercise has more than ``--max`` is seeded).
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import random
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
BEGIN = re.compile(r"^[ \t]*#\s*BEGIN SOLUTION\b")
END = re.compile(r"^[ \t]*#\s*END SOLUTION\b")
HEADING = re.compile(r"^#{2,4}\s*Exercise\s+(\d+\.\d+)", re.M)

ARITH = {ast.Add: [ast.Sub], ast.Sub: [ast.Add], ast.Mult: [ast.Div], ast.Div: [ast.Mult],
         ast.FloorDiv: [ast.Div], ast.Pow: [ast.Mult], ast.MatMult: [ast.Mult], ast.Mod: [ast.FloorDiv]}
COMPARE = {ast.Lt: [ast.LtE, ast.Gt], ast.LtE: [ast.Lt, ast.GtE], ast.Gt: [ast.GtE, ast.Lt],
           ast.GtE: [ast.Gt, ast.LtE], ast.Eq: [ast.NotEq], ast.NotEq: [ast.Eq], ast.Is: [ast.IsNot],
           ast.IsNot: [ast.Is], ast.In: [ast.NotIn], ast.NotIn: [ast.In]}
SWAP_NAMES = {"min": "max", "max": "min", "minimum": "maximum", "maximum": "minimum", "amin": "amax", "amax": "amin",
              "argmin": "argmax", "argmax": "argmin", "floor": "ceil", "ceil": "floor", "mean": "sum", "sum": "mean",
              "sigmoid": "tanh", "log_softmax": "softmax", "softmax": "log_softmax", "triu": "tril", "tril": "triu",
              "cos": "sin", "sin": "cos"}
DROPPABLE_CALLS = {"detach", "float", "clone", "item", "contiguous", "half", "long", "int", "type_as", "to",
                   "squeeze", "unsqueeze", "abs", "sqrt", "exp", "log", "mean", "sum", "transpose", "t", "flatten",
                   "reshape", "view", "softmax", "sigmoid", "clamp", "clamp_min", "cumsum", "sort", "values"}
SORTS = {"sort": ("descending", True), "argsort": ("descending", True), "msort": ("descending", True),
         "sorted": ("reverse", True), "topk": ("largest", False)}  # the keyword that reverses the order
COMMUTATIVE = {"min", "max", "minimum", "maximum", "add", "mul", "isclose", "allclose", "equal", "fmax", "fmin",
               "logical_and", "logical_or", "hypot", "transpose", "swapaxes", "swapdims"}  # transpose(a, b) = (b, a)


# ------------------------------------------------------------------------------------------ mutants
@dataclass
class Mutant:
    what: str
    source: str


def _solution_lines(source: str) -> List[Tuple[int, int]]:
    """1-based, inclusive line ranges strictly between BEGIN and END markers."""
    ranges, start = [], None
    for number, line in enumerate(source.splitlines(), 1):
        if BEGIN.match(line):
            start = number + 1
        elif END.match(line) and start is not None:
            ranges.append((start, number - 1))
            start = None
    return ranges


def _inside(node: ast.AST, ranges: Sequence[Tuple[int, int]]) -> bool:
    line = getattr(node, "lineno", None)
    return line is not None and any(a <= line <= b for a, b in ranges)


def _name_of(func: ast.AST) -> Optional[str]:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


class _Collector(ast.NodeVisitor):
    """Walks the cell's tree and records (node path, mutation) pairs inside the solution lines."""

    def __init__(self, ranges):
        self.ranges = ranges
        self.sites: List[Tuple[Tuple[int, ...], str, str]] = []  # (path, kind, description)
        self.path: List[int] = []

    def generic_visit(self, node):
        for i, child in enumerate(ast.iter_child_nodes(node)):
            self.path.append(i)
            self.visit(child)
            self.path.pop()

    def _add(self, kind: str, what: str, node: ast.AST) -> None:
        if _inside(node, self.ranges):
            self.sites.append((tuple(self.path), kind, what))

    def visit_BinOp(self, node):
        for new in ARITH.get(type(node.op), []):
            self._add(f"binop:{new.__name__}", f"{type(node.op).__name__} -> {new.__name__}", node)
        if isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            self._add("keep:left", f"{type(node.op).__name__}: right operand left out", node)
            self._add("keep:right", f"{type(node.op).__name__}: left operand left out", node)
        self.generic_visit(node)

    def visit_UnaryOp(self, node):
        if isinstance(node.op, (ast.USub, ast.Not)):
            self._add("unary:drop", f"{type(node.op).__name__} dropped", node)
        self.generic_visit(node)

    def visit_Compare(self, node):
        for new in COMPARE.get(type(node.ops[0]), []):
            self._add(f"cmp:{new.__name__}", f"{type(node.ops[0]).__name__} -> {new.__name__}", node)
        self.generic_visit(node)

    def visit_Constant(self, node):
        value = node.value
        if isinstance(value, bool):
            self._add("const:flip", f"{value} -> {not value}", node)
        elif isinstance(value, int):
            self._add("const:+1", f"{value} -> {value + 1}", node)
            self._add("const:-1", f"{value} -> {value - 1}", node)
            if abs(value) >= 8:  # a boundary constant of another size (64 -> 128, 32)
                self._add("const:x2", f"{value} -> {value * 2}", node)
                self._add("const:/2", f"{value} -> {value // 2}", node)
        elif isinstance(value, float):
            self._add("const:x10", f"{value!r} -> {value * 10!r}", node)
            self._add("const:/10", f"{value!r} -> {value / 10!r}", node)

    def visit_BoolOp(self, node):
        self._add("boolop", f"{type(node.op).__name__} swapped", node)
        if isinstance(node.op, ast.Or) and len(node.values) == 2:
            self._add("fallback:or", "the fallback of `or` dropped", node)
        self.generic_visit(node)

    def visit_If(self, node):
        if node.orelse:
            self._add("if:never", f"the if branch on line {node.lineno} never taken (special case dropped)", node)
        else:
            self._add("if:drop", f"the if statement on line {node.lineno} deleted (special case dropped)", node)
        self.generic_visit(node)

    def visit_IfExp(self, node):
        self._add("ifexp:else", "a if c else b -> b (special case dropped)", node)
        self.generic_visit(node)

    def visit_Call(self, node):
        name = _name_of(node.func)
        if name in SWAP_NAMES:
            self._add("callname", f"{name} -> {SWAP_NAMES[name]}", node)
        if name not in COMMUTATIVE:
            for i in range(len(node.args) - 1):
                if not any(isinstance(a, ast.Starred) for a in node.args[i:i + 2]):
                    what = "first two arguments" if i == 0 else f"arguments {i + 1} and {i + 2}"
                    self._add(f"swapargs:{i}", f"{name}(): {what} swapped", node)
        for i in range(len(node.keywords) - 1):
            if node.keywords[i].arg and node.keywords[i + 1].arg:
                self._add(f"swapkw:{i}", f"{name}(): the values of {node.keywords[i].arg}= and "
                          f"{node.keywords[i + 1].arg}= swapped", node)
        if name in ("get", "getattr") and len(node.args) == (2 if name == "get" else 3) and not node.keywords:
            self._add("fallback:arg", f"{name}(): the default dropped", node)
        if name in SORTS and SORTS[name][0] not in {kw.arg for kw in node.keywords}:
            self._add("sortdir", f"{name}(): the other direction ({SORTS[name][0]}={SORTS[name][1]})", node)
        for k, kw in enumerate(node.keywords):
            value = kw.value.operand if isinstance(kw.value, ast.UnaryOp) else kw.value
            if kw.arg and isinstance(value, ast.Constant):
                self._add(f"kwdrop:{k}", f"{name}({kw.arg}=...) left at its default", node)
        if isinstance(node.func, ast.Attribute) and name in DROPPABLE_CALLS:
            self._add("dropcall", f".{name}(...) removed", node)
        for k, kw in enumerate(node.keywords):
            if kw.arg in ("dim", "axis") and isinstance(kw.value, (ast.UnaryOp, ast.Constant)):
                self._add(f"dim:{k}", f"{name}({kw.arg}=...) -> {kw.arg}=0 / 1", node)
            if kw.arg in ("min", "max") and name in ("clamp", "clip", "clamp_"):
                self._add(f"clampkw:{k}", f"{name}({kw.arg}=...) -> {'max' if kw.arg == 'min' else 'min'}=...", node)
        self.generic_visit(node)

    def _statements(self, body_owner: ast.AST, attr: str) -> None:
        body = getattr(body_owner, attr, None)
        if not isinstance(body, list) or len(body) < 2:
            return
        for i, stmt in enumerate(body):
            if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.Expr, ast.AnnAssign)) and not (
                    isinstance(stmt, ast.Expr) and isinstance(getattr(stmt, "value", None), ast.Constant)):
                if _inside(stmt, self.ranges):
                    self.sites.append((tuple(self.path), f"delete:{attr}:{i}", f"statement on line {stmt.lineno} deleted"))

    def visit(self, node):
        for attr in ("body", "orelse"):
            self._statements(node, attr)
        return super().visit(node)


def _node_at(tree: ast.AST, path: Tuple[int, ...]) -> ast.AST:
    node = tree
    for i in path:
        node = list(ast.iter_child_nodes(node))[i]
    return node


def _replace_in_parent(tree: ast.AST, path: Tuple[int, ...], new: ast.AST) -> None:
    parent = _node_at(tree, path[:-1])
    target = _node_at(tree, path)
    for fname, value in ast.iter_fields(parent):
        if value is target:
            setattr(parent, fname, new)
            return
        if isinstance(value, list):
            for i, item in enumerate(value):
                if item is target:
                    value[i] = new
                    return
    raise LookupError("node not found in its parent")


def _apply(tree: ast.AST, path: Tuple[int, ...], kind: str) -> Optional[List[ast.AST]]:
    """Mutated copies of ``tree`` for one site (a site may give two, e.g. dim=0 and dim=1)."""
    out = []

    def fresh():
        t = copy.deepcopy(tree)
        return t, _node_at(t, path)

    if kind.startswith("binop:"):
        t, node = fresh()
        node.op = getattr(ast, kind.split(":")[1])()
        out.append(t)
    elif kind in ("keep:left", "keep:right"):
        t, node = fresh()
        _replace_in_parent(t, path, node.left if kind == "keep:left" else node.right)
        out.append(t)
    elif kind == "unary:drop":
        t, node = fresh()
        _replace_in_parent(t, path, node.operand)
        out.append(t)
    elif kind.startswith("cmp:"):
        t, node = fresh()
        node.ops[0] = getattr(ast, kind.split(":")[1])()
        out.append(t)
    elif kind == "boolop":
        t, node = fresh()
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        out.append(t)
    elif kind.startswith("const:"):
        t, node = fresh()
        v = node.value
        node.value = {"const:flip": lambda: not v, "const:+1": lambda: v + 1, "const:-1": lambda: v - 1,
                      "const:x2": lambda: v * 2, "const:/2": lambda: v // 2, "const:x10": lambda: v * 10,
                      "const:/10": lambda: v / 10}[kind]()
        out.append(t)
    elif kind == "callname":
        t, node = fresh()
        name = _name_of(node.func)
        if isinstance(node.func, ast.Name):
            node.func.id = SWAP_NAMES[name]
        else:
            node.func.attr = SWAP_NAMES[name]
        out.append(t)
    elif kind.startswith("swapargs:"):
        i = int(kind.split(":")[1])
        t, node = fresh()
        node.args[i], node.args[i + 1] = node.args[i + 1], node.args[i]
        out.append(t)
    elif kind.startswith("swapkw:"):
        i = int(kind.split(":")[1])
        t, node = fresh()
        node.keywords[i].value, node.keywords[i + 1].value = node.keywords[i + 1].value, node.keywords[i].value
        out.append(t)
    elif kind == "fallback:or":
        t, node = fresh()
        _replace_in_parent(t, path, node.values[0])
        out.append(t)
    elif kind == "fallback:arg":
        t, node = fresh()
        node.args.pop()
        out.append(t)
    elif kind == "sortdir":
        t, node = fresh()
        key, value = SORTS[_name_of(node.func)]
        node.keywords.append(ast.keyword(arg=key, value=ast.Constant(value)))
        out.append(t)
    elif kind.startswith("kwdrop:"):
        t, node = fresh()
        del node.keywords[int(kind.split(":")[1])]
        out.append(t)
    elif kind == "if:never":
        t, node = fresh()
        node.test = ast.Constant(False)
        out.append(t)
    elif kind == "if:drop":
        t, node = fresh()
        _replace_in_parent(t, path, ast.Pass())
        out.append(t)
    elif kind == "ifexp:else":
        t, node = fresh()
        _replace_in_parent(t, path, node.orelse)
        out.append(t)
    elif kind == "dropcall":
        t, node = fresh()
        _replace_in_parent(t, path, node.func.value)
        out.append(t)
    elif kind.startswith("dim:"):
        k = int(kind.split(":")[1])
        for value in (0, 1):
            t, node = fresh()
            old = node.keywords[k].value
            if isinstance(old, ast.Constant) and old.value == value:
                continue
            node.keywords[k].value = ast.Constant(value)
            out.append(t)
    elif kind.startswith("clampkw:"):
        t, node = fresh()
        kw = node.keywords[int(kind.split(":")[1])]
        kw.arg = "max" if kw.arg == "min" else "min"
        out.append(t)
    elif kind.startswith("delete:"):
        _, attr, i = kind.split(":")
        t, node = fresh()
        body = getattr(node, attr)
        del body[int(i)]
        if not body:
            body.append(ast.Pass())
        out.append(t)
    return out


def mutants(source: str) -> List[Mutant]:
    """Every mutant of the solution lines of one exercise cell, in a fixed order, duplicates removed."""
    ranges = _solution_lines(source)
    tree = ast.parse(source)
    collector = _Collector(ranges)
    collector.visit(tree)
    original = ast.unparse(tree)
    seen, out = {original}, []
    for path, kind, what in collector.sites:
        try:
            trees = _apply(tree, path, kind)
        except (LookupError, IndexError, AttributeError):
            continue
        for mutated in trees or []:
            try:
                text = ast.unparse(ast.fix_missing_locations(mutated))
                compile(text, "<mutant>", "exec")
            except (SyntaxError, ValueError, TypeError):
                continue
            key = re.sub(r"(?<![\w.])-0(?![\w.])", "0", text)  # -0 is 0: one mutant, not two
            if key in seen:
                continue
            seen.add(key)
            line = getattr(_node_at(tree, path), "lineno", "?")
            out.append(Mutant(f"line {line}: {what}", text))
    return out


# ------------------------------------------------------------------------------------------ running
STUBS = False  # --stubs: the student edition's stub is the only "mutant" of each exercise
class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


@dataclass
class Result:
    number: str
    made: int = 0
    tried: int = 0
    caught: int = 0
    timeouts: int = 0
    crashed: int = 0
    survivors: List[str] = field(default_factory=list)
    seconds: float = 0.0


def _exercise_cells(nb: dict) -> List[Tuple[int, str, int]]:
    """(index of the solution cell, exercise number, index of its check cell)."""
    out, number = [], None
    cells = nb["cells"]
    for i, cell in enumerate(cells):
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            m = HEADING.search(src)
            if m:
                number = m.group(1)
            continue
        if _solution_lines(src) and number:
            j = next(k for k in range(i + 1, len(cells)) if cells[k]["cell_type"] == "code")
            out.append((i, number, j))
    return out


def probe_chapter(path: Path, max_mutants: int, timeout: float, only: Optional[set] = None,
                  log=print) -> List[Result]:
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    from IPython.core.interactiveshell import InteractiveShell

    nb = json.loads(path.read_text())
    exercises = {i: (n, j) for i, n, j in _exercise_cells(nb)}
    last = max(j for _, j in exercises.values())
    shell = InteractiveShell.instance()
    os.chdir(path.parent)
    results: List[Result] = []
    signal.signal(signal.SIGALRM, _alarm)
    import io
    import contextlib

    for index, cell in enumerate(nb["cells"][: last + 1]):
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        src = re.sub(r"(?m)^%matplotlib.*$", "", src)  # Agg already: no GUI event loop in a plain shell
        if index in exercises:
            number, check_index = exercises[index]
            if only is None or number in only:
                check_src = "".join(nb["cells"][check_index]["source"])
                results.append(_probe_exercise(shell, number, src, check_src, max_mutants, timeout, log))
        with contextlib.redirect_stdout(io.StringIO()):
            outcome = shell.run_cell(src, silent=True)
        if not outcome.success:
            raise RuntimeError(f"{path.name}: cell {index} failed unmutated: {outcome.error_in_exec or outcome.error_before_exec}")
    return results


def _probe_exercise(shell, number: str, src: str, check_src: str, max_mutants: int, timeout: float, log) -> Result:
    import io
    import contextlib

    import torch

    result = Result(number)
    made = mutants(src)
    if STUBS:  # the student edition's stub: the one program every check must reject
        sys.path.insert(0, str(ROOT / "tools"))
        import make_student

        made = [Mutant("the student edition's stub", make_student.stub_source(src, f"Exercise {number}", "stub"))]
    result.made = len(made)
    if len(made) > max_mutants:
        made = random.Random(f"{number}:{len(made)}").sample(made, max_mutants)
    start = time.time()
    base = dict(shell.user_ns)
    check_code = compile(shell.transform_cell(check_src), f"<check {number}>", "exec")
    for mutant in made:
        ns = dict(base)
        rng = torch.get_rng_state()
        verdict = "survived"
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                try:
                    exec(compile(mutant.source, f"<mutant {number}>", "exec"), ns)
                except _Timeout:
                    raise
                except Exception:
                    verdict = "crashed"
                if verdict == "survived":
                    exec(check_code, ns)
        except _Timeout:
            verdict = "timeout"
        except AssertionError:
            verdict = "caught"
        except Exception:
            verdict = "caught"  # a check that crashes on a mutant still stops the learner
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            torch.set_rng_state(rng)
        result.tried += 1
        if verdict == "survived":
            result.survivors.append(mutant.what)
        else:
            result.caught += 1
            result.timeouts += verdict == "timeout"
            result.crashed += verdict == "crashed"
    result.seconds = time.time() - start
    share = result.caught / result.tried if result.tried else 1.0
    log(f"  Exercise {number}: {result.caught}/{result.tried} caught ({share:.0%}); {result.made} mutants made"
        f"{'' if not result.survivors else '; survivors: ' + ' | '.join(result.survivors)}")
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*", help="chapter numbers (01 .. 12); default: every chapter")
    parser.add_argument("--max", type=int, default=40, help="at most this many mutants per exercise (seeded sample)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a mutant may run before it counts as caught")
    parser.add_argument("--exercise", action="append", help="only these exercises (e.g. 4.5)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--list", action="store_true", help="print every mutant of the chosen exercises and stop")
    parser.add_argument("--stubs", action="store_true", help="plant the student edition's stub instead of the mutants")
    args = parser.parse_args(argv)
    global STUBS
    STUBS = args.stubs
    chapters = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if args.chapters:
        chapters = [p for p in chapters if p.name[:2] in {c.zfill(2) for c in args.chapters}]
    only = set(args.exercise) if args.exercise else None
    if args.list:
        for path in chapters:
            nb = json.loads(path.read_text())
            for i, number, _ in _exercise_cells(nb):
                if only and number not in only:
                    continue
                made = mutants("".join(nb["cells"][i]["source"]))
                print(f"Exercise {number}: {len(made)} mutants")
                for m in made:
                    print(f"  {m.what}")
        return 0
    results: List[Result] = []
    for path in chapters:
        print(f"{path.name}:", flush=True)
        results += probe_chapter(path.resolve(), args.max, args.timeout, only, log=lambda s: print(s, flush=True))
    tried = sum(r.tried for r in results)
    caught = sum(r.caught for r in results)
    worst = min(results, key=lambda r: r.caught / max(r.tried, 1)) if results else None
    print(f"\ntotal: {caught}/{tried} mutants caught ({caught / max(tried, 1):.1%}) over {len(results)} exercises"
          + (f"; lowest: Exercise {worst.number} {worst.caught}/{worst.tried} ({worst.caught / max(worst.tried, 1):.0%})"
             if worst else ""))
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
