"""The current-releases pass of `make test`: torch 2.13.0 with the NEWEST release of everything else.

    python tools/current_releases.py                          # what `make test` runs (its third pass)
    python tools/current_releases.py --setup-only             # create the environment, print the versions
    python tools/current_releases.py --no-package-tests 10    # only chapter 10 (number, name or path)

The pinned environments (``.venv``, ``.colab-venv``) prove the stored outputs with the versions of
``requirements/dev.txt``; a learner brings newer ones (Colab keeps its own transformers, tokenizers,
huggingface_hub, numpy, matplotlib). This pass proves the course with what the registry offers
today, resolved when it runs, never pinned:

1. **A fresh environment** (``.current-venv``, removed and created again on every run):
   ``torch==2.13.0`` first (the CPU wheel; newer torch releases are multi-GB CUDA builds on this
   machine kind, so torch is the one package held, by ``requirements/constraints.txt``), then the
   packages of ``CURRENT`` with no version given: in a fresh environment pip takes the newest
   release of each that the others allow. The allow-list ``requirements/current-exceptions.txt``
   is the only other constraint: a newest release that breaks something the course cannot fix at
   once is excluded there by name and version, dated, with the reason, and printed on every run.
2. **The versions.** Each package of ``CURRENT`` with the version resolved and the registry's newest
   (``pip index versions``); a difference is printed with who holds it back.
3. **The course installs beside them and changes nothing.** The wheel (``colab_like.build_wheel``) is
   installed with its ``[course,hf,hub]`` extras and their dependencies; the run fails if that
   changed the version of any package already there (what a Colab user gets: the course next to
   Colab's own torch and transformers, nothing downgraded). Then the test tools of
   ``requirements/dev.txt`` without its pins of the ``CURRENT`` packages, held at the versions
   just resolved (a tool that cannot live with them is an error naming it).
4. **The package tests** (``pytest tests -m "not gpu"``, ``--workers`` processes, each
   single-threaded, as ``make test-package``), every transformers interop test included.
5. **Every chapter natively.** nbval on every chapter, copied outside the repository
   (``colab_like.run_notebooks``), with the kernel's own settings: no ``ATEN_CPU_CAPABILITY`` (the
   CPU's best SIMD kernels), no ``OMP_NUM_THREADS`` (torch's thread count for the machine), no
   ``MPLBACKEND``. The Colab-like pass runs every chapter the other way (``ATEN_CPU_CAPABILITY=default``,
   one thread, Agg), so each ``make test`` proves every stored output both ways.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import colab_like  # noqa: E402
import tempdir_guard  # noqa: E402
from colab_like import ColabLikeError, canonical, env_python, installed, pip, run  # noqa: E402

DEFAULT_ENV = ROOT / ".current-venv"
#: The one package held (the CPU wheel on this machine kind's disk; newer torch releases are CUDA builds).
TORCH = "torch==2.13.0"
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"
DEV = ROOT / "requirements" / "dev.txt"
EXCEPTIONS = ROOT / "requirements" / "current-exceptions.txt"
EXTRAS = "course,hf,hub"
#: What the course, the package and its [course]/[hf]/[hub] extras use besides torch: installed at
#: their newest release (the chapters' imports, transformers and what it needs, the kernel).
CURRENT = ("transformers", "tokenizers", "huggingface_hub", "numpy", "matplotlib", "ipywidgets", "ipykernel",
           "tqdm", "safetensors", "jinja2")
#: The kernels' settings: the CPU's own SIMD level and thread count (nothing of colab_like.KERNEL_ENV's
#: ATEN_CPU_CAPABILITY / OMP_NUM_THREADS / MPLBACKEND); idle OpenMP threads sleep, since two notebooks
#: run at a time; the stored outputs are CPU outputs.
NATIVE_ENV = {
    "MINIMIND_DEVICE": "cpu",
    "OMP_WAIT_POLICY": "PASSIVE",
    "TOKENIZERS_PARALLELISM": "false",
    "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}
_EXCEPTION = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*!=\s*(?P<version>[^\s#;,]+)\s*"
                        r"#\s*(?P<date>\d{4}-\d{2}-\d{2}):\s*(?P<reason>\S.*)$")


def log(message: str) -> None:
    print(f"[current] {message}", flush=True)


# --- the allow-list ---------------------------------------------------------------------------

def read_exceptions(path: Path = EXCEPTIONS) -> List[Dict[str, str]]:
    """The allow-list: one ``name!=version  # YYYY-MM-DD: reason`` per line (comments and blank lines
    aside). Anything else (a pin, an upper bound, a line without a date or a reason) is a ``ColabLikeError``."""
    entries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        found = _EXCEPTION.match(line.strip())
        if not found:
            raise ColabLikeError(
                f"{path.name}:{number}: {line.strip()!r} is not `name!=version  # YYYY-MM-DD: reason`: the allow-list "
                "excludes single releases, dated, with the reason (a pin or an upper bound would hold a package back "
                "silently).")
        try:
            datetime.date.fromisoformat(found["date"])
        except ValueError:
            raise ColabLikeError(f"{path.name}:{number}: {found['date']!r} is not a date (YYYY-MM-DD).") from None
        entries.append(found.groupdict())
    return entries


def describe_exceptions(entries: Sequence[Dict[str, str]], today: Optional[datetime.date] = None) -> List[str]:
    today = today or datetime.date.today()
    lines = []
    for e in entries:
        age = (today - datetime.date.fromisoformat(e["date"])).days
        lines.append(f"skipping {e['name']} {e['version']} (allow-listed {e['date']}, {age} days ago): {e['reason']}")
    return lines


# --- the environment --------------------------------------------------------------------------

def dev_requirements_without_current(dev: Path = DEV) -> List[str]:
    """requirements/dev.txt's lines, less those of the ``CURRENT`` packages (their pins)."""
    keep = []
    wanted = {canonical(n) for n in CURRENT}
    for line in dev.read_text(encoding="utf-8").splitlines():
        requirement = line.split("#", 1)[0].strip()
        if not requirement:
            continue
        name = re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]
        if canonical(name) not in wanted:
            keep.append(requirement)
    return keep


def newest_on_registry(env: Path, name: str) -> str:
    """The newest release the package index offers (``pip index versions``), or ``?``."""
    proc = subprocess.run([str(env_python(env)), "-m", "pip", "index", "versions", name], capture_output=True,
                          text=True, env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"))
    found = re.search(r"\(([^)]+)\)", proc.stdout or "")
    return found.group(1) if proc.returncode == 0 and found else "?"


def held_back_by(env: Path, name: str) -> str:
    """Which installed packages require ``name`` (the ones that may hold it back)."""
    proc = subprocess.run([str(env_python(env)), "-m", "pip", "show", name], capture_output=True, text=True)
    found = re.search(r"^Required-by:\s*(.*)$", proc.stdout or "", re.M)
    return found.group(1).strip() if found and found.group(1).strip() else "nothing installed"


def version_table(env: Path, versions: Dict[str, str]) -> List[str]:
    rows = []
    for name in CURRENT:
        got = versions.get(canonical(name), "not installed")
        newest = newest_on_registry(env, name)
        note = "" if newest in (got, "?") else f"   (newest on the registry: {newest}; required by: {held_back_by(env, name)})"
        rows.append(f"  {name:<16} {got}{note}")
    return rows


def create_env(env: Path, python: str, scratch: Path, exceptions: Path = EXCEPTIONS) -> Dict[str, str]:
    """A fresh ``env``: torch 2.13.0, then the newest ``CURRENT`` packages; returns their versions."""
    log(f"creating {env} afresh with {python}: {TORCH} first, then the newest "
        f"{', '.join(CURRENT)}")
    shutil.rmtree(env, ignore_errors=True)
    run([python, "-m", "venv", env], f"creating the virtual environment {env}")
    pip(env, "install", "-q", TORCH, what=f"installing {TORCH}")
    pip(env, "install", "-q", "-c", CONSTRAINTS, "-c", exceptions, *CURRENT,
        what="installing the newest " + ", ".join(CURRENT))
    return installed(env)


def install_course_and_tools(env: Path, wheel: Path, scratch: Path, before: Dict[str, str]) -> None:
    """The wheel with its extras and their dependencies (must change nothing already installed), then the
    test tools held at the versions just resolved."""
    pip(env, "install", "-q", f"{wheel}[{EXTRAS}]", what=f"installing {wheel.name}[{EXTRAS}] with its dependencies")
    after = installed(env)
    changed = [f"{n} {v} -> {after.get(n, 'removed')}" for n, v in before.items() if after.get(n) != v]
    if changed:
        raise ColabLikeError(f"installing minimind-ref[{EXTRAS}] changed packages that were already there: "
                             f"{', '.join(changed)}; the extras must accept what a learner has (check pyproject.toml's "
                             "lower bounds).")
    log(f"minimind-ref[{EXTRAS}] installed with its dependencies; no installed package changed version")
    held = scratch / "current-versions.txt"
    held.write_text("".join(f"{n}=={after[canonical(n)]}\n" for n in CURRENT if canonical(n) in after), encoding="utf-8")
    tools = scratch / "dev-without-current.txt"
    tools.write_text("\n".join(dev_requirements_without_current()) + "\n", encoding="utf-8")
    try:
        pip(env, "install", "-q", "-c", CONSTRAINTS, "-c", held, "-r", tools,
            what="installing the test tools of requirements/dev.txt beside the newest releases")
    except ColabLikeError as err:
        raise ColabLikeError(f"{err}\nA test tool of requirements/dev.txt cannot live with the newest releases above: "
                             "update the tool's pin in requirements/dev.txt (and environment.yml).") from None
    pip(env, "check", what="pip check (the environment's dependencies are consistent)")


def runtime_report(env: Path, outside: Path) -> str:
    probe = ("import sys, torch, minimind_ref; print(f'Python {sys.version.split()[0]}, torch {torch.__version__}, "
             "native CPU capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads')")
    return run([env_python(env), "-c", probe], "importing the installed course package", cwd=outside,
               env=colab_like.clean_env(outside, NATIVE_ENV)).stdout.strip()


# --- the run ----------------------------------------------------------------------------------

def package_tests(env: Path, workers: int) -> int:
    return colab_like.run_pytest(env, workers, ["tests"], "package tests (pytest tests -m 'not gpu') with these releases",
                                 say=log)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="chapters to run (default: all), e.g. 05 or 08_training")
    parser.add_argument("--env", type=Path, default=DEFAULT_ENV, help="the virtual environment (default: .current-venv)")
    parser.add_argument("--python", default=getattr(sys, "_base_executable", sys.executable),
                        help="interpreter that creates the environment (default: the one behind this Python)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="test processes and notebooks at a time (default: CPU count)")
    parser.add_argument("--setup-only", action="store_true", help="create the environment, print the versions, stop")
    parser.add_argument("--no-package-tests", action="store_true", help="run the chapters only")
    parser.add_argument("--no-chapters", action="store_true", help="run the package tests only")
    args = parser.parse_args(argv)
    env = args.env.resolve()
    start = time.perf_counter()
    scratch = tempdir_guard.make_private_tempdir("minimind-current-run")  # outside the repository
    try:
        exceptions = read_exceptions()
        for line in describe_exceptions(exceptions) or ["allow-list (requirements/current-exceptions.txt): empty"]:
            log(line)
        notebooks = colab_like.select(args.notebooks)
        wheel = colab_like.build_wheel(scratch / "dist")
        before = create_env(env, args.python, scratch)
        tmp, workdir = scratch / "tmp", scratch / "chapters"
        tmp.mkdir()
        workdir.mkdir()
        install_course_and_tools(env, wheel, scratch, before)
        log("resolved today (torch held at 2.13.0):")
        for row in version_table(env, installed(env)):
            print(row, flush=True)
        log(runtime_report(env, workdir))
        log(f"environment ready in {time.perf_counter() - start:.0f} s")
        if args.setup_only:
            return 0
        code = 0
        if not args.no_package_tests:
            code = package_tests(env, args.workers) or code
            log(f"package tests {'passed' if code == 0 else 'FAILED'}; {time.perf_counter() - start:.0f} s so far")
        if not args.no_chapters:
            chapters = colab_like.run_notebooks(env, notebooks, workdir, tmp, args.workers, kernel_env=NATIVE_ENV,
                                                stubs=False, say=log)
            chapters = chapters or colab_like.left_behind(tmp, workdir, [nb.name for nb in notebooks],
                                                          "the current-releases run")
            code = code or chapters
        log(f"{'passed' if code == 0 else 'FAILED'} in {time.perf_counter() - start:.0f} s")
        return code
    except ColabLikeError as err:
        print(f"[current] FAILED: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        tempdir_guard.remove(scratch)


if __name__ == "__main__":
    sys.exit(main())
