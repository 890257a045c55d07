"""The Colab-like run: every chapter in Colab's runtime, from the installed wheel, outside the repository, under nbval.

    python tools/colab_like.py                      # what `make test` runs (after the package tests)
    python tools/colab_like.py 05 08_training       # some chapters only (number, name or path)
    python tools/colab_like.py --setup-only         # (re)create the environment and stop
    python tools/colab_like.py --python python3.13  # this interpreter for the environment
    python tools/colab_like.py --zh 01,02           # also the Chinese editions of these chapters
    python tools/colab_like.py --refresh-runtime /path/to/backend-info   # Colab published a new runtime

It proves five things at once, in the time of a single pass over the notebooks:

1. **The course runs in Colab's runtime.** ``requirements/colab-runtime.txt`` is Colab's runtime as
   Colab publishes it (the repository googlecolab/backend-info: ``pip-freeze.gpu.txt`` and
   ``os-info-gpu.txt``, its commit and date in the file's header): the Python version
   (``# python: 3.13``) and the releases of torch, transformers, tokenizers, huggingface_hub, numpy,
   matplotlib, ipywidgets, ipykernel and the rest of ``STACK``, with what they need, every one
   pinned to the snapshot's version. The environment (``.colab-venv``) is made from that file
   alone, with that Python (``find_python``), plus the nbval runner of ``requirements/colab.txt``
   held to the same pins; it is created afresh whenever pyproject.toml, one of those two files or
   the interpreter changes (a fingerprint is stored in it), and reused otherwise. Colab's next
   runtime is one edit: ``--refresh-runtime`` rewrites the file from a newer snapshot.
2. **The install cell upgrades nothing Colab preloads.** The chapters' first cell installs
   ``minimind-ref[course]`` with pip's default strategy (``tools/sync_colab_cells.py``). Before the
   course is installed, ``pip install --dry-run --report`` of the wheel's ``[course]`` extra runs in
   that environment; the run fails if pip would change the version of any package there
   (``upgrades_in_report``) and prints what it would add. The sdist and the wheel are built with
   ``python -m build --no-isolation`` (the wheel from the sdist); the wheel must hold every file of
   ``minimind_ref/`` that git tracks or would track (package data included). It is installed, not
   editable, on every run, and ``pip install --no-index <wheel>[course]`` proves the extra's
   dependencies are all there.
3. **No chapter reads repository files.** The notebooks, with their stored outputs, are copied
   into an empty temporary folder outside the repository and run there with no PYTHONPATH; the
   kernel is that environment's Python, whose ``minimind_ref`` comes from its site-packages.
4. **The stored outputs hold on another machine.** nbval compares every output with the stored
   one under kernel settings that differ from those that produced them (``make execute`` runs with
   the CPU's best SIMD level, torch's default thread count and the inline backend, in ``.venv``'s
   Python 3.11 and pinned releases): ``ATEN_CPU_CAPABILITY=default`` (no AVX2/AVX-512 kernels),
   ``OMP_NUM_THREADS=1`` and ``MPLBACKEND=Agg`` (a chapter that does not say ``%matplotlib inline``
   itself shows no figure there, and nbval reports the missing figure). ``MINIMIND_DEVICE=cpu``
   keeps the kernels on the CPU on a GPU machine (the stored outputs are CPU ones; ``make test-gpu``
   runs the chapters on CUDA).
5. **Every exercise check fails on its student stub.** Before nbval runs an exercise cell, the
   plugin ``tools/nbval_stubs.py`` runs, in the same kernel, the stub of the committed student
   edition and the check after it, which must fail (the random state is restored afterwards, so
   the outputs nbval compares are unaffected). Each chapter thus executes once for both proofs.

With ``--zh``, the Chinese editions of the chosen chapters run in the same pass (as
``zh_NN_topic.ipynb``): ``tools/i18n.py`` translates the chapter (its setup cell selects the
Chinese check messages, the check lines of the stored outputs are in Chinese), the stubs come from
``student/zh/``, and nbval compares every output as for the English chapter.

Notebooks run ``--workers`` at a time (pytest-xdist, ``--dist loadfile``: all cells of a notebook
in one kernel, in order), the highest chapter number first (the later chapters are the longest).
Each kernel is single-threaded, so two workers fill two cores. Finally the run fails if it left
a ``minimind_*`` entry in its private temporary folder (``tools/tempdir_guard.py``).
A failure names the notebook and its code cell (nbval's ``NN_topic.ipynb::Cell K`` counts code
cells from 0) and shows the cell's source with the stored and the new output.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import tempdir_guard  # noqa: E402

NOTEBOOKS = ROOT / "notebooks"
STUDENT = ROOT / "student"
STUB_PLUGIN = ROOT / "tools" / "nbval_stubs.py"
DEFAULT_ENV = ROOT / ".colab-venv"
EXTRA = "course"
#: Colab's runtime: its Python version and the snapshot's releases, the one place they are written.
RUNTIME = ROOT / "requirements" / "colab-runtime.txt"
RUNNER = ROOT / "requirements" / "colab.txt"
FINGERPRINT = "minimind-fingerprint.json"
#: What the runtime file pins as Colab has it (``--refresh-runtime`` adds what these need): what the
#: chapters import, the [hf]/[hub] extras' packages Colab preloads, and the notebook kernel.
STACK = ("torch", "transformers", "tokenizers", "huggingface_hub", "numpy", "matplotlib", "ipywidgets", "ipykernel",
         "tqdm", "safetensors")
#: Packages of a snapshot left out of the runtime file: the CUDA libraries come with the registry's torch
#: (a CUDA build of its own; the chapters run on the CPU), and Colab's own wheels are not on the registry.
NOT_PINNED = re.compile(r"^(nvidia-|cuda-|cupy|cudf|cuml|cugraph|cuvs|cucim|nx-cugraph|rmm|pylibraft|raft-dask|libcu)")
# The kernel settings of the run (the stored outputs come from the CPU's best SIMD level, torch's
# default thread count and matplotlib's inline backend).
KERNEL_ENV = {
    "ATEN_CPU_CAPABILITY": "default",
    "OMP_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
    "MINIMIND_DEVICE": "cpu",
    "OMP_WAIT_POLICY": "PASSIVE",
    "TOKENIZERS_PARALLELISM": "false",
    "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}
CELL_TIMEOUT_S = 600
#: nbval waits this long for a new kernel to answer (its default is 60 s).
KERNEL_STARTUP_TIMEOUT_S = 120
#: What nbval's setup error says when a notebook's kernel never answered. ipykernel 7 sometimes hangs at
#: start-up (microsoft/vscode-jupyter#17228, #17410; microsoft/qdk#3661 pins ipykernel 6 for it): then every
#: cell of that notebook errors at setup without having run. Such a notebook runs once more, alone, and the
#: pass says so; a notebook with any other failure is never re-run.
KERNEL_START_FAILURES = ("Kernel didn't respond in", "Kernel died before replying to kernel_info")


class ColabLikeError(RuntimeError):
    """A step of the Colab-like run failed; the message says which and what to do."""


def log(message: str) -> None:
    print(f"[colab-like] {message}", flush=True)


def run(args: Sequence[str], what: str, cwd: Optional[Path] = None, env: Optional[Dict[str, str]] = None,
        quiet: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, text=True,
                          capture_output=quiet)
    if proc.returncode != 0:
        tail = "\n".join(((proc.stdout or "") + (proc.stderr or "")).strip().splitlines()[-25:])
        raise ColabLikeError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return proc


# --- 1. the wheel ---------------------------------------------------------------------------

def package_files(root: Path = ROOT) -> List[str]:
    """Files of minimind_ref/ a release must ship: tracked or untracked-but-not-ignored by git."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "minimind_ref"],
                             cwd=root, capture_output=True, text=True, check=True).stdout.split()
        files = [name for name in out if (root / name).is_file()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but caches
        files = [str(p.relative_to(root)) for p in (root / "minimind_ref").rglob("*") if p.is_file()]
    return sorted(f for f in files if "__pycache__" not in f and not f.endswith(".pyc"))


def missing_from_wheel(wheel: Path, files: Sequence[str]) -> List[str]:
    with zipfile.ZipFile(wheel) as zf:
        shipped = set(zf.namelist())
    return [f for f in files if f not in shipped]


def build_wheel(outdir: Path) -> Path:
    log("building the sdist and the wheel (python -m build --no-isolation; the wheel is built from the sdist)")
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", outdir, ROOT], "building minimind-ref", cwd=ROOT)
    wheels = sorted(outdir.glob("minimind_ref-*.whl"))
    if len(wheels) != 1:
        raise ColabLikeError(f"expected one wheel in {outdir}, found {[w.name for w in wheels]}")
    missing = missing_from_wheel(wheels[0], package_files())
    if missing:
        raise ColabLikeError(
            f"the wheel {wheels[0].name} lacks {len(missing)} file(s) of the package: {', '.join(missing)}. "
            "Add their patterns to [tool.setuptools.package-data] in pyproject.toml.")
    return wheels[0]


# --- 2. Colab's runtime ------------------------------------------------------------------------

def canonical(name: str) -> str:
    """A distribution name as pip compares them (``Jinja2`` = ``jinja2``, ``typing_extensions`` = ``typing-extensions``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


class Runtime(NamedTuple):
    """requirements/colab-runtime.txt: Colab's Python (``"3.13"``; ``python_full``: the snapshot's own),
    where the snapshot comes from (repository, commit, date) and every pin, by canonical name."""

    python: str
    python_full: str
    source: str
    commit: str
    date: str
    pins: Dict[str, str]

    def describe(self) -> str:
        main = ", ".join(f"{n} {self.pins[canonical(n)]}" for n in STACK if canonical(n) in self.pins)
        return (f"Colab's runtime of {self.date} ({self.source} {self.commit[:7]}): Python {self.python_full}, {main}")


_PYTHON_LINE = re.compile(r"^#\s*python:\s*(?P<minor>3\.\d+)\s*\(Colab:\s*(?P<full>3\.\d+\.\d+)\)\s*$")
_SNAPSHOT_LINE = re.compile(r"^#\s*snapshot:\s*(?P<source>\S+/\S+)\s+(?P<commit>[0-9a-f]{40})\s+(?P<date>\d{4}-\d{2}-\d{2})\b")
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s#;]+)\s*(#.*)?$")


def read_runtime(path: Path = RUNTIME) -> Runtime:
    """Parse the runtime file; anything but comments, the two header lines and ``name==version`` pins is a
    ``ColabLikeError`` naming the line (the file is also a pip requirements file)."""
    python = snapshot = None
    pins: Dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.strip()
        if not text:
            continue
        if text.startswith("#"):
            python = _PYTHON_LINE.match(text) or python
            snapshot = _SNAPSHOT_LINE.match(text) or snapshot
            continue
        pin = _PIN.match(text)
        if not pin:
            raise ColabLikeError(f"{path.name}:{number}: {text!r} is not `name==version`: the runtime file pins "
                                 "every package to the snapshot's release.")
        if canonical(pin["name"]) in pins:
            raise ColabLikeError(f"{path.name}:{number}: {pin['name']} is pinned twice.")
        pins[canonical(pin["name"])] = pin["version"]
    if python is None or snapshot is None:
        raise ColabLikeError(f"{path.name} lacks its header: a `# python: 3.N (Colab: 3.N.M)` line and a "
                             "`# snapshot: OWNER/REPO COMMIT YYYY-MM-DD` line (rewrite it with --refresh-runtime).")
    datetime.date.fromisoformat(snapshot["date"])
    if not python["full"].startswith(python["minor"] + "."):
        raise ColabLikeError(f"{path.name}: Python {python['minor']} and Colab's {python['full']} disagree.")
    missing = [n for n in STACK if canonical(n) not in pins]
    if missing:
        raise ColabLikeError(f"{path.name} pins no release of {', '.join(missing)}: every package of STACK is pinned.")
    return Runtime(python["minor"], python["full"], snapshot["source"], snapshot["commit"], snapshot["date"], pins)


def python_candidates(version: str) -> List[str]:
    """Where a ``python3.N`` may be: on PATH, in pyenv's versions and in uv's managed Pythons (``uv python
    install 3.N``; newest patch first), in /usr(/local)/bin."""
    found = [shutil.which(f"python{version}") or ""]
    pyenv_root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    patches = glob.glob(os.path.join(pyenv_root, "versions", f"{version}.*", "bin", f"python{version}"))
    key = lambda p: [int(x) if x.isdigit() else -1 for x in re.findall(r"\d+", Path(p).parents[1].name)]  # noqa: E731
    found += sorted(patches, key=key, reverse=True)
    uv_root = os.environ.get("UV_PYTHON_INSTALL_DIR") or os.path.expanduser("~/.local/share/uv/python")
    managed = glob.glob(os.path.join(uv_root, f"cpython-{version}.*", "bin", f"python{version}"))
    found += sorted(managed, key=key, reverse=True)
    found += [f"/usr/local/bin/python{version}", f"/usr/bin/python{version}"]
    seen: List[str] = []
    for p in found:
        if p and os.path.isfile(p) and os.access(p, os.X_OK) and p not in seen:
            seen.append(p)
    return seen


def find_python(version: str) -> str:
    """An interpreter of Python ``version`` (``"3.13"``) that can make a virtual environment."""
    for candidate in python_candidates(version):
        probe = subprocess.run([candidate, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    raise ColabLikeError(
        f"Colab's runtime is Python {version} (requirements/colab-runtime.txt) and no python{version} with the venv "
        f"module was found on PATH, in pyenv (~/.pyenv/versions/{version}.*) or in /usr/bin. Install it (`pyenv install "
        f"{version}`, or `apt-get install python{version} python{version}-venv`), or pass one: "
        f"`make test-colab COLAB_PYTHON=/path/to/python{version}`.")


# --- 3. the environment -----------------------------------------------------------------------

def env_python(env: Path) -> Path:
    return env / "bin" / "python"


def fingerprint(python: str) -> Dict[str, str]:
    """What the environment is made from; a change means a fresh environment."""
    probe = "import os, sys; print(os.path.realpath(sys.executable)); print(sys.version)"
    executable, version = run([python, "-c", probe], f"running {python}").stdout.strip().split("\n", 1)
    files = {name: hashlib.sha256((ROOT / name).read_bytes()).hexdigest()
             for name in ("pyproject.toml", "requirements/colab-runtime.txt", "requirements/colab.txt")}
    return {"python": executable, "version": version, "extra": EXTRA, **files}


def pip(env: Path, *args: object, what: str) -> subprocess.CompletedProcess:
    return run([env_python(env), "-m", "pip", *args], what, env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"))


def installed(env: Path) -> Dict[str, str]:
    """Every distribution in ``env``, by canonical name, with its version."""
    out = pip(env, "list", "--format=json", what=f"listing {env}").stdout
    return {canonical(p["name"]): p["version"] for p in json.loads(out)}


def off_runtime(versions: Dict[str, str], runtime: Runtime) -> List[str]:
    """``name pinned -> installed`` for each pin of the runtime that ``versions`` lacks or holds at another
    release (a local build tag such as ``+cu128`` aside)."""
    return [f"{name} {pinned} -> {versions.get(name, 'missing')}" for name, pinned in sorted(runtime.pins.items())
            if versions.get(name, "").split("+")[0] != pinned.split("+")[0]]


def ensure_env(env: Path, python: str, runtime: Runtime) -> None:
    wanted = fingerprint(python)
    stamp = env / FINGERPRINT
    if stamp.is_file() and env_python(env).exists():
        try:
            if json.loads(stamp.read_text(encoding="utf-8")) == wanted:
                log(f"reusing {env} ({wanted['version'].split()[0]}; made from the current pyproject.toml and requirements)")
                return
        except ValueError:
            pass
    log(f"creating {env} afresh with {python} ({wanted['version'].split()[0]}): the {len(runtime.pins)} pins of "
        f"{RUNTIME.relative_to(ROOT)}, then the nbval runner of {RUNNER.relative_to(ROOT)} (the first time this "
        f"downloads torch {runtime.pins['torch']}, a CUDA build of some GB; pip caches it)")
    shutil.rmtree(env, ignore_errors=True)
    run([python, "-m", "venv", env], f"creating the virtual environment {env} with {python}")
    pip(env, "install", "-q", "-r", RUNTIME, what=f"installing Colab's runtime ({RUNTIME.name}) into {env}")
    pip(env, "install", "-q", "-c", RUNTIME, "-r", RUNNER, what=f"installing the nbval runner ({RUNNER.name}) into {env}")
    moved = off_runtime(installed(env), runtime)
    if moved:
        raise ColabLikeError(f"{env} does not hold Colab's runtime after the installs: {', '.join(moved)}")
    stamp.write_text(json.dumps(wanted, indent=1), encoding="utf-8")


def upgrades_in_report(report: Dict, before: Dict[str, str], ignore: Sequence[str] = ("minimind-ref",)) -> List[str]:
    """From a ``pip install --dry-run --report`` JSON: ``name old -> new`` for each package pip would install
    that ``before`` (what the environment holds) already has, whatever the direction; ``ignore``: the course itself."""
    changes = []
    for item in report.get("install", []):
        name, version = canonical(item["metadata"]["name"]), item["metadata"]["version"]
        if name in before and name not in {canonical(n) for n in ignore}:
            changes.append(f"{name} {before[name]} -> {version}")
    return sorted(changes)


def additions_in_report(report: Dict, before: Dict[str, str], ignore: Sequence[str] = ("minimind-ref",)) -> List[str]:
    """``name version`` for each package the report would add (absent from ``before``)."""
    return sorted(f"{canonical(i['metadata']['name'])} {i['metadata']['version']}" for i in report.get("install", [])
                  if canonical(i["metadata"]["name"]) not in before
                  and canonical(i["metadata"]["name"]) not in {canonical(n) for n in ignore})


def install_cell_changes_nothing(env: Path, wheel: Path, runtime: Runtime, scratch: Path, extra: str = EXTRA) -> None:
    """What the chapters' install cell does in Colab, as a dry run in Colab's runtime: pip's default strategy on
    ``minimind-ref[course]`` (the wheel stands for the git URL: same metadata). Fails if pip would change any
    package there; then installs it (with what it adds)."""
    before = installed(env)
    report_path = scratch / "install-cell-report.json"
    pip(env, "install", "-q", "--dry-run", "--report", report_path, f"{wheel}[{extra}]",
        what=f"pip install --dry-run of the install cell's minimind-ref[{extra}]")
    report = json.loads(report_path.read_text(encoding="utf-8"))
    changes = upgrades_in_report(report, before)
    if changes:
        raise ColabLikeError(
            f"in Colab's runtime the install cell (minimind-ref[{extra}]) would change packages Colab preloads: "
            f"{', '.join(changes)}. Lower the bound in pyproject.toml to what Colab has ({runtime.describe()}) "
            "and make the course work with it.")
    added = additions_in_report(report, before)
    log(f"install cell, dry run in Colab's runtime: no preloaded package changes; it adds "
        f"{', '.join(added) if added else 'nothing but minimind-ref'}")
    pip(env, "install", "-q", f"{wheel}[{extra}]", what=f"installing minimind-ref[{extra}] as the install cell does")
    moved = off_runtime(installed(env), runtime)
    if moved:
        raise ColabLikeError(f"installing minimind-ref[{extra}] moved Colab's packages: {', '.join(moved)}")


def install_wheel(env: Path, wheel: Path, outside: Path, runtime: Runtime, extra: str = EXTRA) -> str:
    """Install the fresh wheel (not editable) and prove what the chapters import (the ``extra``) is there."""
    pip(env, "install", "-q", "--no-deps", "--force-reinstall", wheel, what=f"installing {wheel.name}")
    try:
        pip(env, "install", "-q", "--no-index", f"{wheel}[{extra}]", what=f"checking the [{extra}] extra")
    except ColabLikeError as err:
        raise ColabLikeError(f"{err}\nThe environment lacks a dependency of minimind-ref[{extra}]: "
                             f"delete {env} and run again.") from None
    pip(env, "check", what="pip check (the environment's dependencies are consistent)")
    where = run([env_python(env), "-c", "import minimind_ref, torch; print(minimind_ref.__file__); print(torch.__version__)"],
                "importing minimind_ref from outside the repository", cwd=outside, env=clean_env(outside)).stdout.split()
    module, torch_version = Path(where[0]), where[1]
    if env.resolve() not in module.resolve().parents or "site-packages" not in module.parts:
        raise ColabLikeError(f"minimind_ref was imported from {module}, not from the installed wheel in {env}")
    if torch_version.split("+")[0] != runtime.pins["torch"].split("+")[0]:
        raise ColabLikeError(f"{env} has torch {torch_version}, Colab's runtime {runtime.pins['torch']}: "
                             f"delete {env} and run again")
    return str(module.parent)


# --- 4. a new runtime -------------------------------------------------------------------------

def snapshot_pins(freeze: str) -> Dict[str, str]:
    """``pip freeze`` text -> {canonical name: version}: ``name==version`` lines only (URL installs and Colab's
    own builds left out), local build tags dropped (``torch==X.Y.Z+cu128`` -> ``X.Y.Z``), ``NOT_PINNED`` left out."""
    pins = {}
    for line in freeze.splitlines():
        found = _PIN.match(line.strip())
        if found and not NOT_PINNED.match(canonical(found["name"])):
            pins[canonical(found["name"])] = found["version"].split("+")[0]
    return pins


def snapshot_python(os_info: str) -> str:
    """The ``Python 3.N.M`` line of ``os-info-gpu.txt`` -> ``"3.N.M"``."""
    found = re.search(r"^Python (3\.\d+\.\d+)\s*$", os_info, re.M)
    if not found:
        raise ColabLikeError("os-info-gpu.txt has no `Python 3.N.M` line")
    return found.group(1)


def render_runtime(python_full: str, source: str, commit: str, date: str, subject: str, names: Sequence[str],
                   closure: Dict[str, str], snapshot: Dict[str, str]) -> str:
    """The text of requirements/colab-runtime.txt: ``closure`` pinned; a package the ``snapshot`` lacks (Colab
    installs it some other way) is marked as such."""
    import textwrap

    minor = ".".join(python_full.split(".")[:2])
    stack = {canonical(n) for n in STACK}

    def pin(name: str) -> str:
        return f"{name}=={closure[name]}" + ("" if snapshot.get(name) == closure[name] else
                                             "  # not in the snapshot's pip freeze: the release pip resolved")

    lines = [
        "# Colab's runtime: the one place the Colab-like pass of `make test` (tools/colab_like.py) reads it from.",
        f"# Source: {source} (Colab's own record of its runtime), commit {commit[:7]} of {date},",
        f"# {subject!r}: pip-freeze.gpu.txt and os-info-gpu.txt.",
        "# The Colab-like environment (.colab-venv) is this interpreter and these pins, nothing else (plus the nbval",
        "# runner of requirements/colab.txt, held to these pins); then the install cell's minimind-ref[course] must",
        "# change none of them (a pip dry run). torch comes from the registry: a CUDA build like Colab's (the CUDA",
        "# libraries are not pinned here), run on the CPU. To move to Colab's next runtime, rewrite this file from",
        "# the new snapshot: python tools/colab_like.py --refresh-runtime /path/to/googlecolab/backend-info",
        "# (or edit the pins by hand); nothing else names these versions.",
        f"# python: {minor} (Colab: {python_full})",
        f"# snapshot: {source} {commit} {date}",
        "",
    ]
    lines += textwrap.wrap(f"The packages the course runs with ({', '.join(names)}), at the snapshot's releases:",
                           width=108, initial_indent="# ", subsequent_indent="# ")
    lines += [pin(n) for n in sorted(closure) if n in stack]
    lines += ["", "# What they need, resolved against the snapshot (at Colab's release where it has the package):"]
    lines += [pin(n) for n in sorted(closure) if n not in stack]
    return "\n".join(lines) + "\n"


def refresh_runtime(backend_info: Path, rev: str = "HEAD", out: Path = RUNTIME, python: Optional[str] = None) -> Runtime:
    """Rewrite the runtime file from a snapshot of googlecolab/backend-info (a git directory, bare or not):
    Python from ``os-info-gpu.txt``; pip resolves ``STACK`` against ``pip-freeze.gpu.txt`` (as constraints) with
    that Python, in a scratch environment, and every package of the resolution is pinned. Needs the registry."""
    def git(*args: str) -> str:
        return run(["git", "-C", backend_info, *args], f"git {' '.join(args)} in {backend_info}").stdout

    freeze, os_info = git("show", f"{rev}:pip-freeze.gpu.txt"), git("show", f"{rev}:os-info-gpu.txt")
    commit, date, subject = git("log", "-1", "--format=%H%n%ad%n%s", "--date=short", rev).strip().split("\n", 2)
    python_full = snapshot_python(os_info)
    interpreter = python or find_python(".".join(python_full.split(".")[:2]))
    scratch = tempdir_guard.make_private_tempdir("minimind-colab-refresh")
    try:
        constraints = scratch / "snapshot.txt"
        constraints.write_text("".join(f"{n}=={v}\n" for n, v in snapshot_pins(freeze).items()), encoding="utf-8")
        venv = scratch / "venv"
        run([interpreter, "-m", "venv", venv], f"creating a scratch environment with {interpreter}")
        report = scratch / "report.json"
        pip(venv, "install", "-q", "--dry-run", "--ignore-installed", "--report", report, "-c", constraints, *STACK,
            what="resolving the stack against the snapshot")
        closure = {canonical(i["metadata"]["name"]): i["metadata"]["version"]
                   for i in json.loads(report.read_text(encoding="utf-8"))["install"]
                   if not NOT_PINNED.match(canonical(i["metadata"]["name"]))}
    finally:
        tempdir_guard.remove(scratch)
    source = "googlecolab/backend-info"
    out.write_text(render_runtime(python_full, source, commit, date, subject, STACK, closure, snapshot_pins(freeze)),
                   encoding="utf-8")
    return read_runtime(out)


# --- 5. the run ---------------------------------------------------------------------------

#: Settings of the caller's environment that never reach a kernel (each run sets its own).
DROPPED = ("PYTHONPATH", "MPLBACKEND", "VIRTUAL_ENV", "PYTHONHOME", "JUPYTER_PATH", "ATEN_CPU_CAPABILITY",
           "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def clean_env(tmp: Path, kernel_env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment of a notebook run: the caller's without ``DROPPED``, plus ``kernel_env``
    (default ``KERNEL_ENV``, this run's), with ``TMPDIR`` the run's private temporary folder."""
    env = {k: v for k, v in os.environ.items() if k not in DROPPED}
    env.update(KERNEL_ENV if kernel_env is None else kernel_env)
    env["TMPDIR"] = str(tmp)
    env[tempdir_guard.ENV] = str(tmp)
    return env


def select(names: Sequence[str]) -> List[Path]:
    chapters = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return chapters
    chosen = []
    for name in names:
        stem = Path(name).stem
        hits = [p for p in chapters if p.stem == stem or p.stem.startswith(stem + "_") or p.name == Path(name).name]
        if not hits:
            raise ColabLikeError(f"no chapter notebook matches {name!r} (have: {', '.join(p.stem for p in chapters)})")
        chosen += [p for p in hits if p not in chosen]
    return chosen


def copy_with_stubs(path: Path, dest: Path, lang: Optional[str] = None) -> int:
    """Copy a chapter (its translation into ``lang`` by tools/i18n.py, with the student edition of
    ``student/<folder>/``), storing in each exercise cell the stub of its committed student edition
    and the source of its check cell (for tools/nbval_stubs.py). Returns the number of exercises."""
    import nbformat

    sys.path.insert(0, str(ROOT / "tools"))
    import make_student

    if lang:
        import i18n

        folder = next(f for f, language in make_student.TRANSLATIONS.items() if language == lang)
        nb = i18n.translated_notebook(path, lang)
        student_path = STUDENT / folder / path.name
    else:
        nb = nbformat.read(path, as_version=4)
        student_path = STUDENT / path.name
    if not student_path.exists():
        raise ColabLikeError(f"{student_path.relative_to(ROOT)} is missing: run `make student`")
    student = nbformat.read(student_path, as_version=4)
    # the student edition leaves out the markdown cells tagged after-solving: its code cells match one for one
    student_code = [c for c in student.cells if c.cell_type == "code"]
    code = [c for c in nb.cells if c.cell_type == "code"]
    if len(student_code) != len(code):
        raise ColabLikeError(f"{student_path.relative_to(ROOT)} does not match {path.name} cell for cell: run `make student`")
    exercises = 0
    for index, cell in enumerate(code):
        if make_student.has_solution(cell.source):
            after = code[index + 1] if index + 1 < len(code) else None
            cell.metadata["minimind_stub"] = {"stub": student_code[index].source, "check": after.source if after else ""}
            exercises += 1
    nbformat.write(nb, dest)
    return exercises


def run_notebooks(env: Path, notebooks: Sequence[Path], workdir: Path, tmp: Path, workers: int,
                  translated: Sequence[Path] = (), lang: str = "zh_CN", kernel_env: Optional[Dict[str, str]] = None,
                  stubs: bool = True, say=log) -> int:
    """nbval on ``notebooks`` and on the ``lang`` editions of ``translated`` (copied as zh_NN_topic.ipynb),
    kernels started with ``kernel_env`` (default ``KERNEL_ENV``); ``stubs``: each exercise check must also
    fail on its student stub (tools/nbval_stubs.py)."""
    kernel_env = KERNEL_ENV if kernel_env is None else kernel_env
    if stubs:
        exercises = sum(copy_with_stubs(nb, workdir / nb.name) for nb in notebooks)
        exercises += sum(copy_with_stubs(nb, workdir / translated_name(nb), lang) for nb in translated)
    else:
        exercises = 0
        for nb in notebooks:
            shutil.copy2(nb, workdir / nb.name)
    names = [nb.name for nb in notebooks] + [translated_name(nb) for nb in translated]
    ini = workdir.parent / "pytest.ini"  # beside the folder, which holds nothing but the notebooks
    ini.write_text("[pytest]\naddopts =\n", encoding="utf-8")
    if stubs:
        shutil.copy2(STUB_PLUGIN, workdir.parent / "conftest.py")  # the stub checks (tools/nbval_stubs.py)
    order = sorted(names, key=lambda n: n.removeprefix("zh_"), reverse=True)  # later chapters are the longest: start them first
    junit = workdir.parent / "nbval-junit.xml"
    args = [env_python(env), "-m", "pytest", "-c", ini, "--rootdir", workdir.parent, "-p", "no:cacheprovider",
            "--nbval", "--nbval-current-env", f"--nbval-cell-timeout={CELL_TIMEOUT_S}",
            f"--nbval-kernel-startup-timeout={KERNEL_STARTUP_TIMEOUT_S}", f"--junitxml={junit}", "-q", "-rfE",
            "--durations=5", "--color=yes" if sys.stdout.isatty() else "--color=no"]
    parallel = ["-n", str(min(workers, len(names))), "--dist", "loadfile", "--no-loadscope-reorder"]
    shown = ("ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS", "MPLBACKEND", "MINIMIND_DEVICE")
    say("kernel settings: " + " ".join(f"{k}={kernel_env.get(k, '(unset)')}" for k in shown))
    say(f"running nbval on {len(names)} notebook(s) ({len(translated)} of them in {lang}) in {workdir} "
        f"with {min(workers, len(names))} worker(s)"
        + (f", and the {exercises} exercise checks on their student stubs" if stubs else ""))
    code = subprocess.run([str(a) for a in args + (parallel if workers > 1 and len(names) > 1 else ["-p", "no:xdist"])
                           + order], cwd=workdir, env=clean_env(tmp, kernel_env)).returncode
    again = kernel_never_started(junit, workdir.name) if code else []
    if code and again:
        say(f"the kernel of {', '.join(again)} never answered (nbval: {KERNEL_START_FAILURES[0]!r}): no cell of it ran; "
            "running it once more, alone")
        code = subprocess.run([str(a) for a in args + ["-p", "no:xdist"] + again], cwd=workdir,
                              env=clean_env(tmp, kernel_env)).returncode
        if code == 0:
            say(f"{', '.join(again)} passed on the second start; every other notebook passed on the first")
    return code


def run_pytest(env: Path, workers: int, targets: Sequence[str], what: str, first: Optional[Path] = None,
               say=log) -> int:
    """pytest on ``targets`` (minus the GPU tests) in ``env`` from the repository root, single-threaded as
    ``make test-package`` runs it; ``first``: a folder put first on PYTHONPATH. Returns pytest's exit code."""
    args = [env_python(env), "-m", "pytest", *targets, "-m", "not gpu", "-q", "--durations=5",
            "-o", "addopts=--nbval-cell-timeout=600 -p no:cacheprovider"]
    args += ["-n", str(workers), "--dist", "loadgroup"] if workers > 1 else ["-p", "no:xdist"]
    environ = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    environ.update(OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", PIP_DISABLE_PIP_VERSION_CHECK="1")
    if first is not None:
        environ["PYTHONPATH"] = str(first)
    say(f"{what} ({workers} worker(s), single-threaded)")
    return subprocess.run([str(a) for a in args], cwd=ROOT, env=environ).returncode


def kernel_never_started(junit: Path, folder: str) -> List[str]:
    """The notebooks of a pytest JUnit report whose every test errored because the kernel never started, when
    nothing else in the report failed; else [] (a real failure is never re-run)."""
    import xml.etree.ElementTree as ElementTree

    try:
        cases = list(ElementTree.parse(junit).getroot().iter("testcase"))
    except (OSError, ElementTree.ParseError):
        return []
    by_file: Dict[str, List[bool]] = {}
    for case in cases:
        bad = [e for e in case if e.tag in ("failure", "error")]
        if not bad:
            continue
        text = " ".join((e.get("message") or "") + (e.text or "") for e in bad)
        by_file.setdefault(case.get("classname", "").removeprefix(folder + "."), []).append(
            any(marker in text for marker in KERNEL_START_FAILURES))
    if not by_file or not all(all(flags) for flags in by_file.values()):
        return []
    return sorted(by_file)


def left_behind(tmp: Path, workdir: Path, ran: Sequence[str], label: str) -> int:
    """1 (after saying what) when the chapters left ``minimind_*`` entries in their temporary folder or
    files in their own folder beside the notebooks ``ran``; else 0."""
    code = 0
    left = tempdir_guard.leftovers(tmp)
    if left:
        print(tempdir_guard.leftover_message(left, label), flush=True)
        code = 1
    written = sorted(p.name for p in workdir.iterdir() if p.name not in set(ran))
    if written:
        print(f"the chapters wrote into their own folder and left it there: {', '.join(written)} "
              "(a learner's folder must stay as it was: write scratch files to a temporary folder "
              "and remove them)", flush=True)
        code = 1
    return code


def translated_name(path: Path) -> str:
    return f"zh_{path.name}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="chapters to run (default: all), e.g. 05 or 08_training")
    parser.add_argument("--env", type=Path, default=DEFAULT_ENV, help="the virtual environment (default: .colab-venv)")
    parser.add_argument("--python", default=None,
                        help="interpreter that creates the environment (default: a python3.N of the runtime file's "
                             "version, found by find_python)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="notebooks at a time (default: CPU count)")
    parser.add_argument("--setup-only", action="store_true", help="build, install and check the wheel, run nothing")
    parser.add_argument("--zh", default="", help="chapters whose Chinese edition runs too (from locales/zh_CN, stubs "
                        "from student/zh/), e.g. 01,02 or all (default: none)")
    parser.add_argument("--refresh-runtime", type=Path, metavar="BACKEND_INFO",
                        help="rewrite requirements/colab-runtime.txt from a git directory of googlecolab/backend-info "
                             "(its HEAD, or --rev) and stop")
    parser.add_argument("--rev", default="HEAD", help="the snapshot's revision for --refresh-runtime (default: HEAD)")
    args = parser.parse_args(argv)
    env = args.env.resolve()
    start = time.perf_counter()
    try:
        if args.refresh_runtime:
            runtime = refresh_runtime(args.refresh_runtime, args.rev, python=args.python)
            log(f"wrote {RUNTIME.relative_to(ROOT)}: {runtime.describe()}; {len(runtime.pins)} pins")
            return 0
        runtime = read_runtime()
        python = args.python or find_python(runtime.python)
    except ColabLikeError as err:
        print(f"[colab-like] FAILED: {err}", file=sys.stderr, flush=True)
        return 1
    log(runtime.describe())
    scratch = tempdir_guard.make_private_tempdir("minimind-colab-like-run")  # outside the repository
    try:
        notebooks = select(args.notebooks)
        translated = [] if not args.zh else select([] if args.zh == "all" else args.zh.split(","))
        wheel = build_wheel(scratch / "dist")
        ensure_env(env, python, runtime)
        tmp = scratch / "tmp"
        workdir = scratch / "chapters"
        tmp.mkdir()
        workdir.mkdir()
        install_cell_changes_nothing(env, wheel, runtime, scratch)
        site = install_wheel(env, wheel, workdir, runtime)
        log(f"{wheel.name} installed in {site}; {time.perf_counter() - start:.0f} s so far")
        if args.setup_only:
            return 0
        code = run_notebooks(env, notebooks, workdir, tmp, args.workers, translated)
        ran = {nb.name for nb in notebooks} | {translated_name(nb) for nb in translated}
        code = code or left_behind(tmp, workdir, ran, "the Colab-like run")
        log(f"{'passed' if code == 0 else 'FAILED'} in {time.perf_counter() - start:.0f} s")
        return code
    except ColabLikeError as err:
        print(f"[colab-like] FAILED: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        tempdir_guard.remove(scratch)


if __name__ == "__main__":
    sys.exit(main())
