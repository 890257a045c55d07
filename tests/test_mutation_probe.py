"""tools/mutation_probe.py: the mutants it plants in an exercise's worked solution, and where it finds them."""

import importlib.util
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("mutation_probe", ROOT / "tools" / "mutation_probe.py")
probe = importlib.util.module_from_spec(spec)
sys.modules["mutation_probe"] = probe  # dataclasses look their module up while the class is made
spec.loader.exec_module(probe)

CELL = '''def f(x, p, limit):
    """doc"""
    # BEGIN SOLUTION: write it
    y = torch.max(x, x.flip(0)).sum(dim=-1) / 2
    g = 2
    while p ** g > limit and g < 64:
        g += 1
    return y.detach() - g
    # END SOLUTION
'''


def test_mutants_cover_the_kinds_of_slip_and_only_the_solution_lines():
    whats = [m.what for m in probe.mutants(CELL)]
    for kind in ("Div -> Mult", "Sub -> Add", "Gt -> GtE", "Lt -> LtE", "2 -> 3", "2 -> 1", "64 -> 65",
                 ".detach(...) removed", "sum(dim=...) -> dim=0 / 1", "And swapped", "statement on line",
                 "Sub: right operand left out", "max -> min"):
        assert any(kind in w for w in whats), (kind, whats)
    assert not any("first two arguments swapped" in w and "max" in w for w in whats), "max(a, b) is max(b, a)"
    assert all(not w.startswith("line 1:") or "deleted" in w for w in whats), "the signature is not mutated"
    sources = {m.source for m in probe.mutants(CELL)}
    assert len(sources) == len(whats), "every mutant is a different program"


KINDS_CELL = '''def g(x, scaling, items, limit):
    # BEGIN SOLUTION: write it
    base = scaling.get("original_max", 2048)
    size = int(limit or 64)
    order = torch.sort(x, dim=-1).values
    text = json.dumps(items, ensure_ascii=False)
    if scaling is None:
        return order
    if size > 32:
        pad = -1e9
    else:
        pad = 0.0
    ramp = ramp_of(x.shape[-1], 1e6, base, beta_fast=32, beta_slow=1)
    return order * ramp + pad if text else order
    # END SOLUTION
'''


def test_mutants_cover_the_mistakes_learners_make():
    """Argument order, boundary constants, sort direction, flags left at their default, dropped
    fallbacks and dropped special cases (issue 44): the mistakes a probe of real learners found."""
    made = probe.mutants(KINDS_CELL)
    whats = [m.what for m in made]
    sources = [m.source for m in made]
    expected = {
        "argument order (a later pair)": "ramp_of(): arguments 2 and 3 swapped",
        "argument order (keywords)": "the values of beta_fast= and beta_slow= swapped",
        "a boundary constant, the other way": "1000000000.0 -> 100000000.0",
        "a boundary constant, ten times": "1000000000.0 -> 10000000000.0",
        "an integer boundary doubled": "64 -> 128",
        "an integer boundary halved": "32 -> 16",
        "a fallback of `or` dropped": "the fallback of `or` dropped",
        "a dict's default dropped": "get(): the default dropped",
        "the sort direction": "sort(): the other direction (descending=True)",
        "an escaping flag left at its default": "dumps(ensure_ascii=...) left at its default",
        "a guard deleted": "the if statement on line 7 deleted",
        "an if branch never taken": "the if branch on line 9 never taken",
        "a conditional expression's special case": "a if c else b -> b",
    }
    for kind, what in expected.items():
        assert any(what in w for w in whats), (kind, what, whats)
    assert any("json.dumps(items)" in s for s in sources), "ensure_ascii removed: json's default escaping"
    assert any("descending=True" in s for s in sources)
    assert any("int(limit)" in s for s in sources), "the 64 fallback dropped"
    assert any("pad = -1e+08" in s or "pad = -100000000.0" in s for s in sources), sources
    assert len(set(sources)) == len(sources), "every mutant is a different program"


def test_every_chapter_exercise_is_found_with_its_check_cell():
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        found = probe._exercise_cells(nb)
        assert len(found) >= 3, path.name
        for solution_index, number, check_index in found:
            assert number.split(".")[0] == str(int(path.name[:2])), (path.name, number)
            assert "check" in nb.cells[check_index].source, (path.name, number)
            assert probe.mutants(nb.cells[solution_index].source), (path.name, number, "no mutant")
