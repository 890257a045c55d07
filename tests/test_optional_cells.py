"""The chapters' optional cells that use upstream's trained MiniMind2 or minimind-3 (tag ``optional-real-weights``).

Offline they print the skip note of their generation (``pretrained.SKIP_NOTES``) and nothing else (nbval
compares that line). Here each
one also runs for real, on synthetic files in upstream's formats (tests/_upstream_files.py: a
``full_sft_<hidden>[_moe].pth`` fp16 state dict and upstream's tokenizer files) registered under
the published model names, so the code that runs in Colab with the real weights is exercised too.
"""

import json
from pathlib import Path

import matplotlib
import pytest

import minimind_ref.pretrained as P

import _upstream_files as U

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parents[1]
TAG = "optional-real-weights"
CELLS = [(path.name, i, "".join(cell["source"]))
         for path in sorted((ROOT / "notebooks").glob("*.ipynb"))
         for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"])
         if TAG in cell.get("metadata", {}).get("tags", [])]
IDS = [f"{name}:{index}" for name, index, _ in CELLS]


def _generation(source):
    """The generation a cell loads: minimind-3 when it asks for a minimind-3 model by name."""
    return "minimind-3" if 'load_or_skip("minimind-3' in source else "MiniMind2"


MINIMIND2_CELLS = [cell for cell in CELLS if _generation(cell[2]) == "MiniMind2"]


def test_the_chapters_have_their_optional_cells():
    chapters = {name for name, _, _ in CELLS}
    assert {"03_attention.ipynb", "05_architecture.ipynb", "06_kv_cache.ipynb", "07_moe.ipynb", "09_sft.ipynb"} <= chapters


@pytest.mark.parametrize("name, index, source", CELLS, ids=IDS)
def test_optional_cell_skips_with_one_line(name, index, source, capsys):
    note = P.SKIP_NOTES[_generation(source)]
    exec(compile(source, f"{name}:{index}", "exec"), {})
    assert capsys.readouterr().out == note + "\n"
    stored = json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))["cells"][index]["outputs"]
    texts = ["".join(o.get("text", "")) for o in stored]  # Jupyter may flush one print as two stdout pieces
    assert all(o.get("name") == "stdout" for o in stored) and "".join(texts) == note + "\n", (
        f"{name} cell {index}: the stored output must be the skip note alone, got {texts}")


@pytest.fixture(scope="module")
def weights_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("minimind2")
    U.save_pth(U.random_model(U.upstream_layout(), seed=0), folder)
    U.save_pth(U.random_model(U.upstream_layout(use_moe=True, intermediate_size=96), seed=1), folder)
    U.write_tokenizer(folder)
    return folder


@pytest.mark.parametrize("name, index, source", MINIMIND2_CELLS, ids=[f"{n}:{i}" for n, i, _ in MINIMIND2_CELLS])
def test_optional_cell_runs_on_upstream_format_files(name, index, source, weights_folder, monkeypatch, capsys):
    monkeypatch.setitem(P.MODELS, "MiniMind2-Small", (64, False, 2))
    monkeypatch.setitem(P.MODELS, "MiniMind2-MoE", (64, True, 2))
    monkeypatch.setenv("MINIMIND_WEIGHTS", str(weights_folder))
    monkeypatch.delenv("PYTEST_VERSION", raising=False)  # what makes load_or_skip skip under the tests
    monkeypatch.delenv("MINIMIND_REAL_WEIGHTS", raising=False)
    monkeypatch.setattr("matplotlib.pyplot.show", lambda *a, **k: None)
    namespace = {}
    exec(compile(source, f"{name}:{index}", "exec"), namespace)
    assert namespace.get("real") is not None, "the cell should have loaded the synthetic weights"
    assert "Optional cell skipped" not in capsys.readouterr().out


# The same cells with minimind-3 (d65ef2c): `load_or_skip("minimind-3")` is all a reader changes. Chapter
# 07's MiniMind2 cell hooks MiniMind2's `MoEGate` and is not reused; chapters 05, 06 and 07 have cells of
# their own for minimind-3 (`load_or_skip("minimind-3")`, `load_or_skip("minimind-3-moe")`, chapter 07's
# hooking the `gate` Linear of minimind-3's `MOEFeedForward`), which run on the same files as they are.
MINIMIND3_CELLS = [(name, index, source.replace('"MiniMind2-Small"', '"minimind-3"'))
                   for name, index, source in CELLS if '"MiniMind2-Small"' in source]
MINIMIND3_CELLS += [cell for cell in CELLS if _generation(cell[2]) == "minimind-3"]


@pytest.fixture(scope="module")
def minimind3_folder(tmp_path_factory):
    """A minimind-3 .pth made by upstream's code (tests/data/upstream_minimind3_files) and the minimind-3 tokenizer."""
    import shutil

    folder = tmp_path_factory.mktemp("minimind3")
    shutil.copy(U.DATA / "upstream_minimind3_files" / "full_sft_32.pth", folder)
    shutil.copy(U.DATA / "upstream_minimind3_files" / "full_sft_32_moe.pth", folder)
    U.write_tokenizer_minimind3(folder)
    return folder


@pytest.mark.parametrize("name, index, source", MINIMIND3_CELLS, ids=[f"{n}:{i}" for n, i, _ in MINIMIND3_CELLS])
def test_optional_cell_runs_with_minimind3(name, index, source, minimind3_folder, monkeypatch, capsys):
    monkeypatch.setitem(P.MODELS, "minimind-3", (32, False, 2))
    monkeypatch.setitem(P.MODELS, "minimind-3-moe", (32, True, 2))
    monkeypatch.setenv("MINIMIND_WEIGHTS", str(minimind3_folder))
    monkeypatch.delenv("PYTEST_VERSION", raising=False)
    monkeypatch.delenv("MINIMIND_REAL_WEIGHTS", raising=False)
    monkeypatch.setattr("matplotlib.pyplot.show", lambda *a, **k: None)
    namespace = {}
    exec(compile(source, f"{name}:{index}", "exec"), namespace)
    assert namespace.get("real") is not None, "the cell should have loaded the synthetic minimind-3 weights"
    real_model, real_tok = namespace["real"]
    assert real_model.config.generation == "minimind-3" and real_tok.encode("<think>") == [25]
    assert "Optional cell skipped" not in capsys.readouterr().out
