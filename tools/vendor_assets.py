"""Fetch the browser assets the site serves itself into ``_vendor/`` (gitignored).

    python tools/vendor_assets.py          # no-op when _vendor/VERSIONS.txt is current

The published book must render math and widgets with no network at view time, so MathJax 3,
the ipywidgets HTML embed manager and RequireJS come from the npm registry at *build* time
(``npm pack``, the ordinary client; npm keeps its own download cache), are checked against the
pinned integrity hashes below, and the files the pages load are copied into ``_vendor/``.
``_config.yml`` adds ``_vendor`` to ``html_static_path`` and points ``mathjax_path`` and
``nb_ipywidgets_js`` at these copies. (Never ``_static/``: Sphinx auto-includes every ``.js``
there, a second time and in the wrong order.)

Layout written::

    _vendor/mathjax/tex-mml-chtml.js (+ input/, output/, a11y/, ui/, sre/ ... loaded on demand)
    _vendor/requirejs/require.js
    _vendor/html-manager/embed-amd.js (+ the font files it references)
    _vendor/VERSIONS.txt              (stamp: what was copied, from which package)
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT / "_vendor"
STAMP = VENDOR / "VERSIONS.txt"

# name -> (version, npm integrity). Change both together; the stamp then forces a refresh.
PACKAGES = {
    "mathjax": (
        "3.2.2",
        "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
    ),
    "@jupyter-widgets/html-manager": (
        "1.0.6",
        "sha512-+Mn+Ra8wyIHrYaUpfmf9A3dsLkt/NuwzPQN8sthdxBD35VV5cOJbpmgMhNR27n/rmP3mKyEe0PWCJrtZrXTXDQ==",
    ),
    "requirejs": (
        "2.3.8",
        "sha512-7/cTSLOdYkNBNJcDMWf+luFvMriVm7eYxp4BcFCsAX0wF421Vyce5SXP17c+Jd5otXKGNehIonFlyQXSowL6Mw==",
    ),
}

# MathJax's other combined entry points are not loaded by the site; everything else under es5/
# (TeX extensions, fonts, menu, accessibility) is fetched on demand and must be there.
MATHJAX_SKIP = {
    "tex-chtml.js", "tex-chtml-full.js", "tex-chtml-full-speech.js", "tex-svg.js", "tex-svg-full.js",
    "tex-mml-svg.js", "mml-chtml.js", "mml-svg.js", "node-main.js",
}
FONT_SUFFIXES = {".woff", ".woff2", ".ttf", ".eot", ".svg"}


def stamp_text() -> str:
    lines = ["# Written by tools/vendor_assets.py; served from _static/ by the book."]
    lines += [f"{name}=={version} {integrity}" for name, (version, integrity) in PACKAGES.items()]
    return "\n".join(lines) + "\n"


def integrity_of(path: Path) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


def npm_pack(dest: Path) -> dict:
    """Download the pinned tarballs with ``npm pack``; return name -> unpacked package folder."""
    npm = shutil.which("npm")
    if npm is None:
        sys.exit("vendor_assets: npm not found (Debian: apt-get install -y npm)")
    specs = [f"{name}@{version}" for name, (version, _) in PACKAGES.items()]
    out = subprocess.run(
        [npm, "pack", "--json", "--silent", "--pack-destination", str(dest), *specs],
        check=True, capture_output=True, text=True,
    ).stdout
    folders = {}
    for entry in json.loads(out):
        name = entry["name"]
        version, integrity = PACKAGES[name]
        tgz = dest / entry["filename"]
        if entry["version"] != version or integrity_of(tgz) != integrity:
            sys.exit(f"vendor_assets: {name}@{entry['version']} does not match the pinned integrity {integrity}")
        unpacked = dest / name.replace("/", "__")
        with tarfile.open(tgz) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(unpacked, filter="data")
            else:  # Python < 3.11.4: no extraction filters; the tarball's integrity was checked above
                tar.extractall(unpacked)
        folders[name] = unpacked / "package"
    return folders


def copy_assets(folders: dict, target: Path) -> None:
    es5 = folders["mathjax"] / "es5"
    shutil.copytree(es5, target / "mathjax", ignore=lambda d, names: [n for n in names if Path(d) == es5 and n in MATHJAX_SKIP])
    (target / "requirejs").mkdir()
    shutil.copy2(folders["requirejs"] / "require.js", target / "requirejs" / "require.js")
    dist = folders["@jupyter-widgets/html-manager"] / "dist"
    (target / "html-manager").mkdir()
    shutil.copy2(dist / "embed-amd.js", target / "html-manager" / "embed-amd.js")
    for font in dist.iterdir():
        if font.suffix in FONT_SUFFIXES:
            shutil.copy2(font, target / "html-manager" / font.name)


def main() -> int:
    if STAMP.exists() and STAMP.read_text() == stamp_text():
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folders = npm_pack(Path(tmp))
        staging = Path(tmp) / "_vendor"
        staging.mkdir()
        copy_assets(folders, staging)
        (staging / "VERSIONS.txt").write_text(stamp_text())
        shutil.rmtree(VENDOR, ignore_errors=True)
        shutil.copytree(staging, VENDOR)
    print(f"vendor_assets: wrote {VENDOR.relative_to(ROOT)}/ ({', '.join(f'{n}@{v}' for n, (v, _) in PACKAGES.items())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
