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


def test_every_chapter_exercise_is_found_with_its_check_cell():
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        found = probe._exercise_cells(nb)
        assert len(found) >= 3, path.name
        for solution_index, number, check_index in found:
            assert number.split(".")[0] == str(int(path.name[:2])), (path.name, number)
            assert "check" in nb.cells[check_index].source, (path.name, number)
            assert probe.mutants(nb.cells[solution_index].source), (path.name, number, "no mutant")
