"""The floors of the package (CONTRIBUTING.md, "Architecture"): the import graph of ``minimind_ref``
and ``tools`` has no circle, and no module imports one on a floor above its own.

The graph is read statically with ``ast`` from the source files: every ``import`` and ``from ...
import`` counts, at module level, inside functions and under ``if TYPE_CHECKING:`` alike (a
function-level import is still an arrow: it runs the other module when the function runs). An
import names the most specific module of the two packages it reaches (``from . import chat_data``
is ``minimind_ref.chat_data``, ``from minimind_ref import MiniMindConfig`` the package root
``minimind_ref``); the tools import each other by bare name (``import i18n``, with ``tools/`` on
``sys.path``). Imports of anything else (torch, the standard library) are not arrows here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("minimind_ref", "tools")

#: The floors, bottom first. A module may import modules on its own floor or below it, never above;
#: an entry ending in ``.*`` places every module under that name (and the name itself).
FLOORS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("foundations", ("minimind_ref.config", "minimind_ref.files", "minimind_ref.utils", "minimind_ref.i18n")),
    ("text", ("minimind_ref.tokenizer", "minimind_ref.data", "minimind_ref.datafiles", "minimind_ref.token_cache",
              "minimind_ref.chat_data",
              "minimind_ref.truncation", "minimind_ref.upstream_tokenizer", "minimind_ref.chat_template",
              "minimind_ref.loss_mask")),
    ("layers", ("minimind_ref.norm", "minimind_ref.rope", "minimind_ref.cache", "minimind_ref.attention",
                "minimind_ref.ffn", "minimind_ref.moe")),
    ("decoding", ("minimind_ref.generation",)),
    ("model", ("minimind_ref.model", "minimind_ref.params", "minimind_ref.fast_decode", "minimind_ref.graph_decode")),
    ("model files", ("minimind_ref.checkpoint", "minimind_ref.hf", "minimind_ref.upstream_weights",
                     "minimind_ref.pretrained", "minimind_ref.export", "minimind_ref")),
    ("training", ("minimind_ref.distributed", "minimind_ref.run_state", "minimind_ref.train", "minimind_ref.plan")),
    ("fine-tuning", ("minimind_ref.sft",)),
    ("stages", ("minimind_ref.stage_registry", "minimind_ref.stage_set", "minimind_ref.chat_eval",
                "minimind_ref.stage_report", "minimind_ref.stages")),
    ("post-training", ("minimind_ref.lora", "minimind_ref.dpo", "minimind_ref.grpo")),
    ("experiments", ("minimind_ref.posttrain_experiments",)),
    ("checks", ("minimind_ref.checks.*",)),
    ("tool libraries", ("tools.solution_markers", "tools.tempdir_guard", "tools.upstream_fixtures")),
    ("tools", ("tools.*",)),
)


# ---------------------------------------------------------------------- reading the graph
def module_files(root: Path = ROOT) -> Dict[str, Path]:
    """``{dotted name: file}`` for every module of ``PACKAGES`` (a package is its ``__init__``)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _known(name: str, modules: Iterable[str]) -> Optional[str]:
    """The longest prefix of ``name`` that is one of ``modules``."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def imports_of(module: str, source: str, modules: Set[str], is_package: bool = False) -> Set[str]:
    """The modules of ``modules`` that ``source`` (the text of ``module``) imports, anywhere in it."""
    out: Set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)] + ([node.module] if node.module else [])
                prefix = ".".join(base)
            else:
                prefix = node.module or ""
            names = [f"{prefix}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if module.startswith("tools.") and f"tools.{name.split('.')[0]}" in modules:
                name = f"tools.{name}"  # tools/ is on sys.path: `import i18n` is tools/i18n.py
            target = _known(name, modules)
            if target and target != module:
                out.add(target)
    return out


def import_graph(root: Path = ROOT) -> Dict[str, Set[str]]:
    files = module_files(root)
    names = set(files)
    return {m: imports_of(m, p.read_text(encoding="utf-8"), names, p.name == "__init__.py") for m, p in files.items()}


# ---------------------------------------------------------------------- the rules
def floor_of(module: str, floors=FLOORS) -> Optional[int]:
    """The index of ``module``'s floor in ``floors`` (an exact entry wins over a ``.*`` one)."""
    for index, (_, entries) in enumerate(floors):
        if module in entries:
            return index
    for index, (_, entries) in enumerate(floors):
        if any(e.endswith(".*") and (module == e[:-2] or module.startswith(e[:-1])) for e in entries):
            return index
    return None


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Every import circle: the strongly connected components with more than one module (Tarjan),
    each as a closed path ``[a, b, ..., a]`` through it."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_closed_path(graph, set(c)) for c in components]


def _closed_path(graph: Dict[str, Set[str]], component: Set[str]) -> List[str]:
    """A circle through the first module of ``component`` (breadth-first back to it)."""
    start = min(component)
    previous: Dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return path[::-1] + [start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(component)


def upward_imports(graph: Dict[str, Set[str]], floors=FLOORS) -> List[str]:
    """``"a (floor) imports b (higher floor)"`` for every arrow that runs up."""
    out = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            here, there = floor_of(module, floors), floor_of(target, floors)
            if here is not None and there is not None and there > here:
                out.append(f"{module} ({floors[here][0]}) imports {target} ({floors[there][0]})")
    return out


# ---------------------------------------------------------------------- the tests
@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_every_module_has_a_floor(graph):
    unplaced = sorted(m for m in graph if floor_of(m) is None)
    assert not unplaced, (
        f"{unplaced} are on no floor: add each to FLOORS in tests/test_architecture.py, on the lowest floor at or "
        "above every module it imports and below every module that imports it, and name it in CONTRIBUTING.md's "
        "Architecture section.")


def test_every_floor_entry_is_a_module(graph):
    stale = [e for _, entries in FLOORS for e in entries if not e.endswith(".*") and e not in graph]
    assert not stale, f"FLOORS names {stale}, which are no module of {PACKAGES} any more: remove or rename them."


def test_no_import_circle(graph):
    found = cycles(graph)
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found) + (
        ". Move what both need into a module below both (as minimind_ref/truncation.py and "
        "tools/solution_markers.py were made).")


def test_no_import_runs_up_the_floors(graph):
    found = upward_imports(graph)
    assert not found, "imports that run up the floors (CONTRIBUTING.md, Architecture): " + "; ".join(found)


def stated_floors(text: str) -> List[Tuple[str, Tuple[str, ...]]]:
    """The floors of CONTRIBUTING.md's Architecture table, spelled as ``FLOORS`` spells them
    (``config`` is ``minimind_ref.config``, ``__init__`` the package root, ``tools/x`` ``tools.x``)."""
    section = text.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    out = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not re.match(r"^\d+ ", cells[0]):
            continue
        names = []
        for name in re.findall(r"`([^`]+)`", cells[1]):
            if name.startswith("tools/"):
                names.append(name.replace("/", "."))
            else:
                names.append("minimind_ref" if name == "__init__" else f"minimind_ref.{name}")
        out.append((cells[0].split(" ", 1)[1], tuple(names)))
    return out


def test_contributing_states_these_floors():
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    stated = stated_floors(text)
    assert [(name, sorted(entries)) for name, entries in stated] == [(name, sorted(entries)) for name, entries in FLOORS], (
        "CONTRIBUTING.md's Architecture table and FLOORS in tests/test_architecture.py must name the same floors "
        "with the same modules, in the same order: change both.")


# ---------------------------------------------------------------------- the checks can fail
def test_the_reader_sees_every_kind_of_import():
    modules = {"minimind_ref", "minimind_ref.a", "minimind_ref.b", "minimind_ref.c", "minimind_ref.d",
               "minimind_ref.checks", "minimind_ref.checks.ch01", "tools.x", "tools.y"}
    source = ("from . import a\nfrom .b import thing\nimport torch\n"
              "def f():\n    from minimind_ref.c import g\n"
              "if TYPE_CHECKING:\n    from .d import T\n")
    assert imports_of("minimind_ref.e", source, modules) == {"minimind_ref.a", "minimind_ref.b", "minimind_ref.c",
                                                             "minimind_ref.d"}
    assert imports_of("minimind_ref.checks.ch02", "from .. import a\nfrom .ch01 import h\nfrom minimind_ref import X\n",
                      modules) == {"minimind_ref.a", "minimind_ref.checks.ch01", "minimind_ref"}
    assert imports_of("minimind_ref.checks", "from .ch01 import h\n", modules, is_package=True) == {
        "minimind_ref.checks.ch01"}
    assert imports_of("tools.x", "def f():\n    import y\n", modules) == {"tools.y"}


def test_a_planted_circle_and_a_planted_upward_import_are_found(graph):
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    planted = {m: set(t) for m, t in graph.items()}
    planted["minimind_ref.config"].add("minimind_ref.train")  # train imports config: also a circle
    assert upward_imports(planted) == ["minimind_ref.config (foundations) imports minimind_ref.train (training)"]
    assert any("minimind_ref.config" in c for c in cycles(planted))


def test_the_graph_is_read_from_the_code(graph):
    # a function-level import (solve_problems imports generation inside the function) is an arrow
    assert "minimind_ref.generation" in graph["minimind_ref.train"]
    # the circles this test was written against are gone, and their replacements are in place
    assert "minimind_ref.sft" not in graph["minimind_ref.train"]
    assert "minimind_ref.truncation" in graph["minimind_ref.sft"] & graph["minimind_ref.train"]
    assert "tools.make_student" not in graph["tools.i18n"]
    assert "tools.solution_markers" in graph["tools.i18n"] & graph["tools.make_student"]
    assert len(graph) > 40 and sum(map(len, graph.values())) > 100
