"""The Colab-like run: every chapter from the installed wheel, outside the repository, under nbval.

    python tools/colab_like.py                      # what `make test` runs (after the package tests)
    python tools/colab_like.py 05 08_training       # some chapters only (number, name or path)
    python tools/colab_like.py --setup-only         # (re)create the environment and stop
    python tools/colab_like.py --python python3.12  # another interpreter for the environment
    python tools/colab_like.py --zh 01,02           # also the Chinese editions of these chapters

It proves four things at once, in the time of a single pass over the notebooks:

1. **The package is complete.** The sdist and the wheel of ``minimind-ref`` are built with
   ``python -m build --no-isolation`` (the wheel from the sdist); the wheel must hold every file of
   ``minimind_ref/`` that git tracks or would track (package data included). It is installed, not
   editable, into its own virtual environment (``.colab-venv``), which holds only torch==2.13.0
   (installed first), the wheel's ``[course]`` extra (what the Colab cell installs) and the nbval
   runner of ``requirements/colab.txt``, under ``requirements/constraints.txt`` and the pins of
   ``requirements/dev.txt``. The environment is created afresh whenever pyproject.toml, one of those
   files or the interpreter changes (a fingerprint is stored in it), and reused otherwise; the wheel
   is rebuilt and reinstalled on every run, and ``pip install --no-index <wheel>[course]`` proves
   the extra's dependencies are all there.
2. **No chapter reads repository files.** The notebooks, with their stored outputs, are copied
   into an empty temporary folder outside the repository and run there with no PYTHONPATH; the
   kernel is that environment's Python, whose ``minimind_ref`` comes from its site-packages.
3. **The stored outputs hold on another machine.** nbval compares every output with the stored
   one under kernel settings that differ from those that produced them (``make execute`` runs with
   the CPU's best SIMD level, torch's default thread count and the inline backend):
   ``ATEN_CPU_CAPABILITY=default`` (no AVX2/AVX-512 kernels), ``OMP_NUM_THREADS=1`` and
   ``MPLBACKEND=Agg`` (a chapter that does not say ``%matplotlib inline`` itself shows no figure
   there, and nbval reports the missing figure). ``MINIMIND_DEVICE=cpu`` keeps the kernels on the
   CPU on a GPU machine (the stored outputs are CPU ones; ``make test-gpu`` runs the chapters on CUDA).

4. **Every exercise check fails on its student stub.** Before nbval runs an exercise cell, the
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
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import tempdir_guard  # noqa: E402

NOTEBOOKS = ROOT / "notebooks"
STUDENT = ROOT / "student"
STUB_PLUGIN = ROOT / "tools" / "nbval_stubs.py"
DEFAULT_ENV = ROOT / ".colab-venv"
EXTRA = "course"
TORCH = "torch==2.13.0"
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"
DEV = ROOT / "requirements" / "dev.txt"
RUNNER = ROOT / "requirements" / "colab.txt"
FINGERPRINT = "minimind-fingerprint.json"
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


# --- 2. the environment ---------------------------------------------------------------------

def env_python(env: Path) -> Path:
    return env / "bin" / "python"


def fingerprint(python: str) -> Dict[str, str]:
    """What the environment is made from; a change means a fresh environment."""
    probe = "import os, sys; print(os.path.realpath(sys.executable)); print(sys.version)"
    executable, version = run([python, "-c", probe], f"running {python}").stdout.strip().split("\n", 1)
    files = {name: hashlib.sha256((ROOT / name).read_bytes()).hexdigest()
             for name in ("pyproject.toml", "requirements/constraints.txt", "requirements/dev.txt", "requirements/colab.txt")}
    return {"python": executable, "version": version, "torch": TORCH, "extra": EXTRA, **files}


def pip(env: Path, *args: object, what: str) -> subprocess.CompletedProcess:
    return run([env_python(env), "-m", "pip", *args], what, env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"))


def ensure_env(env: Path, python: str, wheel: Path) -> None:
    wanted = fingerprint(python)
    stamp = env / FINGERPRINT
    if stamp.is_file() and env_python(env).exists():
        try:
            if json.loads(stamp.read_text(encoding="utf-8")) == wanted:
                log(f"reusing {env} ({wanted['version'].split()[0]}; made from the current pyproject.toml and requirements)")
                return
        except ValueError:
            pass
    log(f"creating {env} afresh with {python} ({wanted['version'].split()[0]}): {TORCH} first, then the "
        f"wheel's [{EXTRA}] extra and requirements/colab.txt (this downloads packages once)")
    shutil.rmtree(env, ignore_errors=True)
    run([python, "-m", "venv", env], f"creating the virtual environment {env} with {python}")
    pip(env, "install", "-q", TORCH, what=f"installing {TORCH} into {env}")
    pip(env, "install", "-q", "-c", CONSTRAINTS, "-c", DEV, "-r", RUNNER, f"{wheel}[{EXTRA}]",
        what=f"installing the wheel's [{EXTRA}] extra and requirements/colab.txt into {env}")
    stamp.write_text(json.dumps(wanted, indent=1), encoding="utf-8")


def install_wheel(env: Path, wheel: Path, outside: Path, extra: str = EXTRA) -> str:
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
    if not torch_version.startswith(TORCH.split("==")[1]):
        raise ColabLikeError(f"{env} has torch {torch_version}, expected {TORCH}: delete {env} and run again")
    return str(module.parent)


# --- 3. the run ---------------------------------------------------------------------------

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
    args = [env_python(env), "-m", "pytest", "-c", ini, "--rootdir", workdir.parent, "-p", "no:cacheprovider",
            "--nbval", "--nbval-current-env", f"--nbval-cell-timeout={CELL_TIMEOUT_S}", "-q", "-rfE", "--durations=5",
            "--color=yes" if sys.stdout.isatty() else "--color=no"]
    if workers > 1 and len(names) > 1:
        args += ["-n", str(min(workers, len(names))), "--dist", "loadfile", "--no-loadscope-reorder"]
    else:
        args += ["-p", "no:xdist"]
    args += order
    shown = ("ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS", "MPLBACKEND", "MINIMIND_DEVICE")
    say("kernel settings: " + " ".join(f"{k}={kernel_env.get(k, '(unset)')}" for k in shown))
    say(f"running nbval on {len(names)} notebook(s) ({len(translated)} of them in {lang}) in {workdir} "
        f"with {min(workers, len(names))} worker(s)"
        + (f", and the {exercises} exercise checks on their student stubs" if stubs else ""))
    return subprocess.run([str(a) for a in args], cwd=workdir, env=clean_env(tmp, kernel_env)).returncode


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
    parser.add_argument("--python", default=getattr(sys, "_base_executable", sys.executable),
                        help="interpreter that creates the environment (default: the one behind this Python)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="notebooks at a time (default: CPU count)")
    parser.add_argument("--setup-only", action="store_true", help="build, install and check the wheel, run nothing")
    parser.add_argument("--zh", default="", help="chapters whose Chinese edition runs too (from locales/zh_CN, stubs "
                        "from student/zh/), e.g. 01,02 or all (default: none)")
    args = parser.parse_args(argv)
    env = args.env.resolve()
    start = time.perf_counter()
    scratch = tempdir_guard.make_private_tempdir("minimind-colab-like-run")  # outside the repository
    try:
        notebooks = select(args.notebooks)
        translated = [] if not args.zh else select([] if args.zh == "all" else args.zh.split(","))
        wheel = build_wheel(scratch / "dist")
        ensure_env(env, args.python, wheel)
        tmp = scratch / "tmp"
        workdir = scratch / "chapters"
        tmp.mkdir()
        workdir.mkdir()
        site = install_wheel(env, wheel, workdir)
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
