"""Where learners run the course: Colab's runtime, the oldest releases the package declares, GPUs without
native bf16 (Colab's T4) and Apple silicon (MPS). Nothing here needs a GPU, a Mac or the network:

* **Colab's runtime** (``requirements/colab-runtime.txt``, read by ``tools/colab_like.py``): the file is
  well formed and names its source; the chapters' install cell asks for nothing Colab's releases do not
  already satisfy (the static twin of the Colab-like pass's pip dry run); the dry run's report is read
  right; the interpreter is found; a runtime is written back from a snapshot as it was read.
* **The floors** (``tools/floors.py``, ``make test-floors``): the oldest releases are read from
  pyproject.toml and agree with the runtime file's Python.
* **Half precision** (``minimind_ref.utils.half_precision``): the capability is mocked: 7.5 (T4) ->
  fp16 with a gradient scaler, 8.0 and newer -> bf16, MPS -> fp16, the CPU -> none.
* **Apple silicon**: a static scan of the package and of every chapter for float64 and complex tensors
  (MPS has neither) on the notebook's device; the exercise checks compare on the CPU.
* **The record's statistics** print the same on every Python (an exact sum, independent of the order).
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import stat
import sys
from pathlib import Path

import nbformat
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import colab_like  # noqa: E402
import sync_colab_cells  # noqa: E402

tomllib = pytest.importorskip("tomllib")
from packaging.requirements import Requirement  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


# --- Colab's runtime -----------------------------------------------------------------------------

def test_the_runtime_file_is_colabs_snapshot_written_once():
    runtime = colab_like.read_runtime()
    assert runtime.source == "googlecolab/backend-info" and re.fullmatch(r"[0-9a-f]{40}", runtime.commit)
    assert runtime.python_full.startswith(runtime.python + ".") and runtime.date
    for name in colab_like.STACK:
        assert colab_like.canonical(name) in runtime.pins
    text = colab_like.RUNTIME.read_text(encoding="utf-8")
    assert runtime.commit[:7] in text and runtime.date in text, "the header names the snapshot's commit and date"
    # nothing else in the repository's tooling names Colab's releases: the pass reads them from this file
    for path in (ROOT / "tools" / "colab_like.py", ROOT / "Makefile", ROOT / "requirements" / "colab.txt"):
        source = path.read_text(encoding="utf-8")
        for name in ("torch", "transformers", "ipywidgets", "numpy"):
            assert f"{name}=={runtime.pins[colab_like.canonical(name)]}" not in source, (path.name, name)


@pytest.mark.parametrize("line, message", [
    ("torch>=2.11", "is not `name==version`"),
    ("torch==2.11.0\ntorch==2.11.0", "pinned twice"),
])
def test_a_malformed_runtime_file_is_refused(tmp_path, line, message):
    header = "# python: 3.13 (Colab: 3.13.15)\n# snapshot: googlecolab/backend-info " + "a" * 40 + " 2026-08-19\n"
    path = tmp_path / "colab-runtime.txt"
    path.write_text(header + line + "\n", encoding="utf-8")
    with pytest.raises(colab_like.ColabLikeError, match=re.escape(message)):
        colab_like.read_runtime(path)
    path.write_text("torch==2.11.0\n", encoding="utf-8")
    with pytest.raises(colab_like.ColabLikeError, match="lacks its header"):
        colab_like.read_runtime(path)


def _declared(*extras: str):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    return [Requirement(r) for r in requirements]


def test_the_install_cell_upgrades_nothing_colab_preloads():
    """pip's default strategy keeps an installed release that satisfies the requirement: every requirement of
    the install cell (and of the [hf]/[hub] extras, whose packages Colab preloads too) must accept Colab's
    release. The Colab-like pass proves the same with `pip install --dry-run` in that runtime."""
    pins = colab_like.read_runtime().pins
    asked = [Requirement(r) for r in sync_colab_cells.requirements()]
    assert {r.name for r in asked} == {r.name for r in _declared("course")}
    for requirement in asked + _declared("hf", "hub"):
        pinned = pins.get(colab_like.canonical(requirement.name))
        assert pinned is not None, f"Colab's runtime file has no {requirement.name}: refresh it or add it to STACK"
        assert requirement.specifier.contains(pinned, prereleases=True), (
            f"{requirement} would upgrade Colab's {requirement.name} {pinned}")


def test_the_install_cell_comment_lists_what_pyproject_declares():
    cell = sync_colab_cells.colab_cell()
    flat = " ".join(line.lstrip("# ").strip() for line in cell.splitlines() if line.startswith("#"))
    assert "(" + ", ".join(sync_colab_cells.requirements()) + ")" in flat


def test_the_dry_run_report_is_read_right():
    report = {"install": [{"metadata": {"name": "ipywidgets", "version": "8.1.9"}},
                          {"metadata": {"name": "comm", "version": "0.2.3"}},
                          {"metadata": {"name": "minimind-ref", "version": "0.1.0"}},
                          {"metadata": {"name": "Jupyterlab_Widgets", "version": "3.0.16"}}]}
    before = {"ipywidgets": "7.7.1", "jupyterlab-widgets": "3.0.16", "minimind-ref": "0.1.0", "torch": "2.11.0"}
    # a reinstall at the same version is a change too: pip would replace what Colab has
    assert colab_like.upgrades_in_report(report, before) == ["ipywidgets 7.7.1 -> 8.1.9",
                                                             "jupyterlab-widgets 3.0.16 -> 3.0.16"]
    assert colab_like.additions_in_report(report, before) == ["comm 0.2.3"]
    assert colab_like.upgrades_in_report({"install": []}, before) == []


def test_off_runtime_names_every_moved_pin():
    runtime = colab_like.Runtime("3.13", "3.13.15", "googlecolab/backend-info", "a" * 40, "2026-08-19",
                                 {"torch": "2.11.0", "numpy": "2.1.3", "tqdm": "4.67.3"})
    assert colab_like.off_runtime({"torch": "2.11.0+cu130", "numpy": "2.4.6"}, runtime) == [
        "numpy 2.1.3 -> 2.4.6", "tqdm 4.67.3 -> missing"]


def test_a_runtime_is_written_back_from_a_snapshot_as_read(tmp_path):
    freeze = ("# generated\ntorch==2.11.0+cu128\nnvidia-cublas-cu12==12.8.4.1\nJinja2==3.1.6\n"
              "tokenizers==0.22.2\nsome-wheel @ https://example.org/x.whl\n")
    assert colab_like.snapshot_pins(freeze) == {"torch": "2.11.0", "jinja2": "3.1.6", "tokenizers": "0.22.2"}
    assert colab_like.snapshot_python("Ubuntu 22.04.5 LTS\nPython 3.13.15\nR version 4.6.1\n") == "3.13.15"
    with pytest.raises(colab_like.ColabLikeError, match="Python 3.N.M"):
        colab_like.snapshot_python("Ubuntu 22.04.5 LTS\n")
    closure = {colab_like.canonical(n): "1.0" for n in colab_like.STACK} | {"jinja2": "3.1.6", "jedi": "0.20.1"}
    snapshot = {n: v for n, v in closure.items() if n != "jedi"}  # a package Colab installs some other way
    text = colab_like.render_runtime("3.13.15", "googlecolab/backend-info", "b" * 40, "2026-08-19", "Upgrade",
                                     colab_like.STACK, closure, snapshot)
    assert "jedi==0.20.1  # not in the snapshot" in text and "jinja2==3.1.6\n" in text
    path = tmp_path / "colab-runtime.txt"
    path.write_text(text, encoding="utf-8")
    parsed = colab_like.read_runtime(path)
    assert parsed.pins == closure and (parsed.python, parsed.python_full) == ("3.13", "3.13.15")
    assert (parsed.commit, parsed.date) == ("b" * 40, "2026-08-19")


def test_the_interpreter_is_found_and_a_missing_one_is_named(tmp_path, monkeypatch):
    fake = tmp_path / "python3.99"
    fake.write_text("#!/bin/sh\necho 3.99\n", encoding="utf-8")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    assert colab_like.find_python("3.99") == str(fake)
    with pytest.raises(colab_like.ColabLikeError, match=r"no python3\.98 .*COLAB_PYTHON"):
        colab_like.find_python("3.98")


def test_make_test_colab_uses_the_runtimes_python():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    colab = makefile.split("\ntest-colab:", 1)[1].split("\n\n", 1)[0]
    assert "$(if $(COLAB_PYTHON),--python $(COLAB_PYTHON))" in colab and "$(PYTHON)" not in colab
    assert re.search(r"^COLAB_PYTHON \?=\s*$", makefile, re.M), "COLAB_PYTHON is empty by default"


# --- the floors -----------------------------------------------------------------------------------

def test_the_floors_are_read_from_pyproject():
    import floors

    pins = floors.floor_pins()
    for requirement in _declared("train", "hf", "hub", "course"):
        lower = [s.version for s in requirement.specifier if s.operator == ">="]
        assert lower, f"{requirement} declares no floor: every dependency of the package declares the oldest release it supports"
        assert pins[colab_like.canonical(requirement.name)] == max(lower, key=_version)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["requires-python"] == f">={floors.python_floor()}"
    assert _version(floors.python_floor()) <= _version(colab_like.read_runtime().python), \
        "Colab's Python is within requires-python"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "tools/floors.py" in makefile.split("\ntest-floors:", 1)[1].split("\n\n", 1)[0]


def _version(text: str):
    from packaging.version import Version

    return Version(text)


# --- half precision ---------------------------------------------------------------------------------

@pytest.mark.parametrize("capability, name, dtype, scaler", [
    ((7, 5), "Tesla T4", torch.float16, True),
    ((7, 0), "Tesla V100-SXM2-16GB", torch.float16, True),
    ((6, 1), "GeForce GTX 1080", torch.float16, True),
    ((8, 0), "NVIDIA A100-SXM4-40GB", torch.bfloat16, False),
    ((8, 6), "NVIDIA GeForce RTX 3090", torch.bfloat16, False),
    ((9, 0), "NVIDIA H100 80GB HBM3", torch.bfloat16, False),
])
def test_half_precision_follows_the_compute_capability(monkeypatch, capability, name, dtype, scaler):
    from minimind_ref.utils import HalfPrecision, half_precision

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    # what the rule must not follow: by default torch counts emulated bf16, and answers True on a T4
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    chosen = half_precision("cuda")
    assert isinstance(chosen, HalfPrecision)
    assert (chosen.dtype, chosen.needs_scaler) == (dtype, scaler)
    assert name in chosen.reason and f"{capability[0]}.{capability[1]}" in chosen.reason
    assert chosen.reason.startswith("bf16" if dtype == torch.bfloat16 else "fp16 with a gradient scaler")


def test_half_precision_off_cuda():
    from minimind_ref.utils import half_precision

    assert half_precision("mps")[:2] == (torch.float16, True)
    assert half_precision(torch.device("cpu"))[:2] == (None, False)
    assert "fp32" in half_precision("cpu").reason


def test_chapter_06_decodes_in_the_chosen_half_precision():
    nb = nbformat.read(ROOT / "notebooks" / "06_kv_cache.ipynb", as_version=4)
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "torch.bfloat16 if on_gpu" not in source, "chapter 06 must not take bf16 on every GPU"
    assert "half_precision(device)" in source and "half.reason" in source


# --- Apple silicon ----------------------------------------------------------------------------------

WIDE = re.compile(r"float64|\.double\(\)|torch\.double\b|complex|view_as_complex|torch\.polar")
#: Where the package itself widens to float64: each is on the CPU by construction, and why.
PACKAGE_FLOAT64 = {
    "minimind_ref/utils.py": "default_tolerance compares a dtype, creates no tensor",
    "minimind_ref/checks/core.py": "the checks move both tensors to the CPU first, then widen (MPS has no float64)",
    "minimind_ref/checks/ch04.py": "a case built on the CPU from a CPU generator",
    "minimind_ref/model.py": "attention_mask.is_complex() refuses a complex mask; creates none",
    "minimind_ref/files.py": "a type name in a comment of the JSON writer",
    "minimind_ref/checkpoint.py": "the plain Python types a checkpoint may hold (complex numbers), not tensors",
    "minimind_ref/generation.py": "input_ids.is_complex() refuses complex ids; creates none",
    "minimind_ref/checks/ch02.py": "a comment on the RoPE check's cases (whole indices round alike in float32 and float64)",
    "minimind_ref/checks/ch09.py": "counts of the check's own CPU label cases, and a tensor made from a Python number (CPU)",
    "minimind_ref/checks/diagnosis.py": "close_tensors moves both tensors to the CPU, then widens",
}


def test_the_package_puts_no_float64_or_complex_tensor_on_a_device():
    found = {}
    for path in sorted((ROOT / "minimind_ref").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        hits = [n for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if WIDE.search(line)]
        if hits:
            found[rel] = hits
    assert set(found) == set(PACKAGE_FLOAT64), (
        f"float64/complex use in {sorted(set(found) - set(PACKAGE_FLOAT64))} (MPS has neither: keep it on the CPU and "
        f"list the file in PACKAGE_FLOAT64 with why); listed but gone: {sorted(set(PACKAGE_FLOAT64) - set(found))}")


def _device_names(tree: ast.AST) -> set:
    """Names a cell assigns from an expression that mentions ``device`` (not the meta device): tensors on the
    notebook's device."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            text = ast.unparse(node.value)
            if re.search(r"\bdevice\b", text) and "meta" not in text:
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def _code(cell) -> str:
    return "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))


def test_no_chapter_puts_a_float64_or_complex_tensor_on_the_notebooks_device():
    """Every float64 or complex computation of a chapter runs on CPU tensors: a line that widens a tensor may
    not mention ``device`` or a name the cell assigned from it. (Static: no Mac was available.)"""
    offending, widened = [], 0
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for index, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
            code = _code(cell)
            tree = ast.parse(code)
            on_device = _device_names(tree) | {"device"}
            for line in code.splitlines():
                if WIDE.search(line.split("#", 1)[0]):
                    widened += 1
                    used = set(re.findall(r"[A-Za-z_]\w*", line.split("#", 1)[0]))
                    if used & on_device:
                        offending.append(f"{path.name} code cell {index}: {line.strip()}")
    assert widened > 20, "the scan found the chapters' float64 uses (rule 4: a check that cannot fail)"
    assert not offending, "float64/complex on the notebook's device (MPS has neither):\n" + "\n".join(offending)


def test_the_device_scan_catches_a_float64_on_the_device():
    tree = ast.parse("x = torch.randn(3, device=device)\ny = x.double()\n")
    assert "x" in _device_names(tree)
    assert WIDE.search("y = x.double()")


def test_checks_widen_to_float64_only_on_the_cpu():
    """The exercise checks compare in float64; on MPS a float64 tensor cannot exist, so every widening in
    ``checks/core.py`` is of a tensor moved to the CPU first (``x.cpu().to(torch.float64)``)."""
    tree = ast.parse((ROOT / "minimind_ref" / "checks" / "core.py").read_text(encoding="utf-8"))
    widenings = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                 and node.func.attr in ("to", "double") and "float64" in ast.unparse(node) + node.func.attr.replace("double", "float64")]
    assert len(widenings) >= 4
    for node in widenings:
        receiver = node.func.value
        assert isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute) and receiver.func.attr == "cpu", (
            f"checks/core.py line {node.lineno}: {ast.unparse(node)} widens a tensor that may be on MPS: move it "
            "to the CPU first")


# --- the record prints the same on every Python -------------------------------------------------------

def test_the_records_statistics_do_not_depend_on_the_order_of_the_sum():
    """Python 3.12's ``sum`` of floats is compensated and 3.11's is not, so a mean that sits on a rounding
    boundary printed 63.4% on one and 63.3% on the other. ``stage_report`` sums exactly (``math.fsum``):
    relabelling the seeds (which reorders every sum) changes no mean, on any Python."""
    from minimind_ref import stage_report, stages

    records = stages.load_seed_records()
    seeds = sorted(records["stages"]["sft"], key=int)
    relabel = dict(zip(seeds, seeds[::-1]))
    shuffled = json.loads(json.dumps(records))
    for name, per_seed in records["stages"].items():
        shuffled["stages"][name] = {relabel.get(s, s): runs for s, runs in per_seed.items()}
    compared = 0
    for stage, metric, _ in stages.STAGE_CLAIMS:
        a = stage_report.stage_effect(stage, metric, records)
        b = stage_report.stage_effect(stage, metric, shuffled)
        assert (a["mean"], a["parent_mean"]) == (b["mean"], b["parent_mean"]), (stage, metric)
        values = [float(run["metrics"][metric]) for _, _, run in stage_report.seed_runs(records, stage)]
        assert a["mean"] == math.fsum(values) / len(values)
        compared += 1
    assert compared >= 5
