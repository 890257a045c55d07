"""The floors pass (`make test-floors`): the package with the OLDEST releases pyproject.toml declares.

    python tools/floors.py                      # what `make test-floors` runs
    python tools/floors.py --setup-only         # create the environment, print the versions, stop
    python tools/floors.py --no-package-tests 01_normalization   # chapter 01 only

pyproject.toml declares, for everything the package and its extras use, the oldest release it supports
(each requirement's ``>=`` bound) and the oldest Python (``requires-python``). Nothing else would notice
when the code starts to need something newer (``torch.nn.RMSNorm`` is torch 2.4, the ``enable_gqa``
argument of ``scaled_dot_product_attention`` torch 2.5), so this pass installs exactly those releases and
runs everything against them. It is its own target, not part of ``make test`` (its old torch is a CUDA
build of some GB from the registry; pip caches it), and is run before a change of the floors or of the
code's use of torch is committed; CONTRIBUTING.md ("The oldest releases") has the last run.

1. **The environment** (``.floors-venv``): the oldest Python (``python_floor()``, found as the Colab-like
   pass finds its own), made afresh whenever pyproject.toml, requirements/dev.txt or the interpreter
   change. ``floor_pins()``: every declared package at its floor, the ``[hf]`` and ``[hub]`` packages
   aside (step 3). Then the wheel with its ``[train,course]`` extras, which must change none of them,
   and the test tools of requirements/dev.txt without their pins of the floor packages, held to those
   pins.
2. **The package tests** (``pytest tests -m "not gpu"``, as ``make test-package``; the transformers
   interop tests skip, transformers being absent) and **every chapter** under nbval, natively, outside
   the repository (``colab_like.run_notebooks``; the stubs are proven by the Colab-like pass).
3. **The [hf] and [hub] floors**: transformers and huggingface_hub at their floors, with the oldest
   tokenizers that transformers' floor accepts (``oldest_allowed``: tokenizers' own floor is older than
   any transformers 4.57 takes); then the test files that use them (``HF_TESTS``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import colab_like  # noqa: E402
import tempdir_guard  # noqa: E402
from colab_like import ColabLikeError, canonical, env_python, installed, pip, run  # noqa: E402

DEFAULT_ENV = ROOT / ".floors-venv"
PYPROJECT = ROOT / "pyproject.toml"
DEV = ROOT / "requirements" / "dev.txt"
EXTRAS = ("train", "course", "hf", "hub")
#: The extras whose packages step 3 installs (transformers needs a newer tokenizers than tokenizers' floor).
LATER = ("hf", "hub")
#: The tests of step 3: the files that use transformers or huggingface_hub.
HF_TESTS = ("tests/test_hf.py", "tests/test_hf_files.py", "tests/test_pretrained.py", "tests/test_pretrained_minimind3.py",
            "tests/test_bad_input.py")
FINGERPRINT = "minimind-fingerprint.json"
NATIVE_ENV = {
    "MINIMIND_DEVICE": "cpu",
    "OMP_WAIT_POLICY": "PASSIVE",
    "TOKENIZERS_PARALLELISM": "false",
    "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}


def log(message: str) -> None:
    print(f"[floors] {message}", flush=True)


# --- what pyproject.toml declares ------------------------------------------------------------------

def _project(pyproject: Path = PYPROJECT) -> Dict:
    import tomllib

    return tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]


def _lower_bound(requirement: str) -> Optional[str]:
    from packaging.requirements import Requirement
    from packaging.version import Version

    bounds = [s.version for s in Requirement(requirement).specifier if s.operator in (">=", "==", "~=")]
    return max(bounds, key=Version) if bounds else None


def declared(extras: Sequence[str] = EXTRAS, pyproject: Path = PYPROJECT, base: bool = True) -> Dict[str, List[str]]:
    """{canonical name: [requirement, ...]} of the package's dependencies (``base``) and ``extras``."""
    from packaging.requirements import Requirement

    project = _project(pyproject)
    found: Dict[str, List[str]] = {}
    own = list(project["dependencies"]) if base else []
    for requirement in own + [r for e in extras for r in project["optional-dependencies"][e]]:
        found.setdefault(canonical(Requirement(requirement).name), []).append(requirement)
    return found


def floor_pins(extras: Sequence[str] = EXTRAS, pyproject: Path = PYPROJECT, base: bool = True) -> Dict[str, str]:
    """{canonical name: oldest release} over the dependencies (``base``) and ``extras`` (the highest of a package's
    lower bounds); a package declared without one is a ``ColabLikeError`` (its floor would be untested)."""
    pins = {}
    for name, requirements in declared(extras, pyproject, base).items():
        bounds = [b for b in map(_lower_bound, requirements) if b]
        if not bounds:
            raise ColabLikeError(f"pyproject.toml declares {name} without a lower bound ({', '.join(requirements)}): "
                                 "declare the oldest release the package supports, and test it here.")
        from packaging.version import Version

        pins[name] = max(bounds, key=Version)
    return pins


def python_floor(pyproject: Path = PYPROJECT) -> str:
    found = re.fullmatch(r">=\s*(3\.\d+)", _project(pyproject)["requires-python"].strip())
    if not found:
        raise ColabLikeError("requires-python in pyproject.toml must read `>=3.N`")
    return found.group(1)


def oldest_allowed(report: Dict, name: str) -> Optional[str]:
    """From a ``pip install --dry-run --report``: the oldest release of ``name`` that every package of the
    report accepts (the highest lower bound among their ``Requires-Dist`` on it), or None."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    bounds = []
    for item in report.get("install", []):
        for text in item["metadata"].get("requires_dist", []) or []:
            requirement = Requirement(text)
            if canonical(requirement.name) == canonical(name) and requirement.marker is None:
                bounds += [s.version for s in requirement.specifier if s.operator in (">=", "==", "~=")]
    return max(bounds, key=Version) if bounds else None


def dev_requirements_without(names: Sequence[str], dev: Path = DEV) -> List[str]:
    """requirements/dev.txt's lines, less those of ``names`` (their pins would contradict the floors)."""
    wanted = {canonical(n) for n in names}
    keep = []
    for line in dev.read_text(encoding="utf-8").splitlines():
        requirement = line.split("#", 1)[0].strip()
        if requirement and canonical(re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]) not in wanted:
            keep.append(requirement)
    return keep


# --- the environment --------------------------------------------------------------------------------

def ensure_env(env: Path, python: str, wheel: Path, scratch: Path) -> Dict[str, str]:
    """``env`` with the floors of step 1, the wheel's [train,course] extras and the test tools; returns the pins."""
    pins = {n: v for n, v in floor_pins().items() if n not in floor_pins(LATER, base=False)}
    probe = run([python, "-c", "import sys; print(sys.version)"], f"running {python}").stdout.strip()
    wanted = {"python": os.path.realpath(python), "version": probe, "pins": pins,
              **{name: hashlib.sha256((ROOT / name).read_bytes()).hexdigest()
                 for name in ("pyproject.toml", "requirements/dev.txt")}}
    stamp = env / FINGERPRINT
    if stamp.is_file() and env_python(env).exists():
        try:
            if json.loads(stamp.read_text(encoding="utf-8")) == wanted:
                log(f"reusing {env} (Python {probe.split()[0]}; made from the current pyproject.toml and requirements)")
                return pins
        except ValueError:
            pass
    log(f"creating {env} afresh with {python} (Python {probe.split()[0]}): "
        + ", ".join(f"{n}=={v}" for n, v in sorted(pins.items()))
        + f" (the first time this downloads torch {pins['torch']}, a CUDA build of some GB; pip caches it)")
    shutil.rmtree(env, ignore_errors=True)
    run([python, "-m", "venv", env], f"creating the virtual environment {env}")
    held = scratch / "floors.txt"
    held.write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())), encoding="utf-8")
    pip(env, "install", "-q", "-r", held, what="installing the floors")
    before = installed(env)
    pip(env, "install", "-q", f"{wheel}[train,course]", what="installing the wheel's [train,course] extras")
    changed = [f"{n} {v} -> {installed(env).get(n, 'removed')}" for n, v in before.items() if installed(env).get(n) != v]
    if changed:
        raise ColabLikeError(f"installing minimind-ref[train,course] changed the floors: {', '.join(changed)}")
    tools = scratch / "dev-without-floors.txt"
    later = list(floor_pins(LATER, base=False)) + ["tokenizers"]  # dev.txt's transformers pin needs a newer tokenizers
    tools.write_text("\n".join(dev_requirements_without(list(pins) + later)) + "\n", encoding="utf-8")
    try:
        pip(env, "install", "-q", "-c", held, "-r", tools, what="installing the test tools of requirements/dev.txt")
    except ColabLikeError as err:
        raise ColabLikeError(f"{err}\nA test tool cannot live with the floors: raise the floor that it names in "
                             "pyproject.toml, and say why there.") from None
    pip(env, "check", what="pip check")
    from packaging.version import Version

    now = installed(env)
    moved = [f"{n} {v} -> {now.get(n, 'missing')}" for n, v in pins.items() if n not in now or Version(now[n]) != Version(v)]
    if moved:
        raise ColabLikeError(f"the test tools moved the floors: {', '.join(moved)}")
    stamp.write_text(json.dumps(wanted, indent=1), encoding="utf-8")
    return pins


def install_later(env: Path, scratch: Path) -> "tuple[Dict[str, str], Path]":
    """Step 3's packages at their floors, with the oldest tokenizers transformers' floor accepts, into a folder of
    their own (``pip install --target``, first on PYTHONPATH for step 3's tests), so the environment keeps step 1's
    floors for the next run. Returns the versions and the folder."""
    later = floor_pins(LATER, base=False)
    asked = [f"{n}=={v}" for n, v in later.items()]
    report_path = scratch / "later.json"
    pip(env, "install", "-q", "--dry-run", "--ignore-installed", "--report", report_path, *asked,
        what="resolving " + ", ".join(asked))
    tokenizers = oldest_allowed(json.loads(report_path.read_text(encoding="utf-8")), "tokenizers")
    if tokenizers:
        asked.append(f"tokenizers=={tokenizers}")
    target = scratch / "hf-floors"
    constraints = scratch / "held.txt"  # what the environment has, torch and numpy above all, stays as it is
    keep = {n: v for n, v in installed(env).items() if n not in {canonical(a.split("==")[0]) for a in asked}}
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in keep.items() if n != "minimind-ref"), encoding="utf-8")
    # (what the folder repeats of the environment is the same release, held by the constraints)
    pip(env, "install", "-q", "--target", target, "-c", constraints, *asked, what="installing " + ", ".join(asked))
    return {**later, **({"tokenizers": tokenizers} if tokenizers else {})}, target


def versions_line(env: Path, outside: Path) -> str:
    probe = ("import sys, torch, numpy, minimind_ref; print(f'Python {sys.version.split()[0]}, torch {torch.__version__}, "
             "numpy {numpy.__version__}')")
    return run([env_python(env), "-c", probe], "importing the installed course package", cwd=outside,
               env=colab_like.clean_env(outside, NATIVE_ENV)).stdout.strip()


def pytest_in(env: Path, workers: int, targets: Sequence[str], what: str, first: Optional[Path] = None) -> int:
    """pytest in ``env`` from the repository root (``colab_like.run_pytest``); ``first``: first on PYTHONPATH."""
    return colab_like.run_pytest(env, workers, targets, what, first=first, say=log)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="chapters to run (default: all), e.g. 05 or 08_training")
    parser.add_argument("--env", type=Path, default=DEFAULT_ENV, help="the virtual environment (default: .floors-venv)")
    parser.add_argument("--python", default=None, help="interpreter (default: a python3.N of requires-python's floor)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="test processes and notebooks at a time")
    parser.add_argument("--setup-only", action="store_true", help="create the environment, print the versions, stop")
    parser.add_argument("--no-package-tests", action="store_true", help="skip the package tests of step 2")
    parser.add_argument("--no-chapters", action="store_true", help="skip the chapters of step 2")
    parser.add_argument("--no-hf", action="store_true", help="skip step 3")
    args = parser.parse_args(argv)
    env = args.env.resolve()
    start = time.perf_counter()
    scratch = tempdir_guard.make_private_tempdir("minimind-floors-run")
    try:
        python = args.python or colab_like.find_python(python_floor())
        notebooks = colab_like.select(args.notebooks)
        wheel = colab_like.build_wheel(scratch / "dist")
        ensure_env(env, python, wheel, scratch)
        pip(env, "install", "-q", "--no-deps", "--force-reinstall", wheel, what=f"installing {wheel.name}")
        tmp, workdir = scratch / "tmp", scratch / "chapters"
        tmp.mkdir()
        workdir.mkdir()
        log("floors: " + versions_line(env, workdir) + "; " + ", ".join(
            f"{n} {installed(env).get(n, '?')}" for n in sorted(floor_pins()) if n not in floor_pins(LATER, base=False)))
        log(f"environment ready in {time.perf_counter() - start:.0f} s")
        if args.setup_only:
            return 0
        code = 0
        if not args.no_package_tests:
            ignore = [f"--ignore={t}" for t in HF_TESTS]  # step 3 runs them, with transformers and safetensors
            code = pytest_in(env, args.workers, ["tests", *ignore],
                             "package tests at the floors (those of transformers and the hub in step 3)") or code
        if not args.no_chapters:
            chapters = colab_like.run_notebooks(env, notebooks, workdir, tmp, args.workers, kernel_env=NATIVE_ENV,
                                                stubs=False, say=log)
            code = code or chapters or colab_like.left_behind(tmp, workdir, [nb.name for nb in notebooks], "the floors run")
        if not args.no_hf:
            later, folder = install_later(env, scratch)
            log("[hf]/[hub] floors: " + ", ".join(f"{n} {v}" for n, v in later.items()))
            code = pytest_in(env, args.workers, list(HF_TESTS), "the transformers and huggingface_hub tests at their floors",
                             first=folder) or code
        log(f"{'passed' if code == 0 else 'FAILED'} in {time.perf_counter() - start:.0f} s")
        return code
    except ColabLikeError as err:
        print(f"[floors] FAILED: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        tempdir_guard.remove(scratch)


if __name__ == "__main__":
    sys.exit(main())
