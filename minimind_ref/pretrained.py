"""Upstream's trained models, MiniMind2 and minimind-3: load their published weights and tokenizer,
fetch them if asked.

Three kinds of files, each read without ``transformers``:

==========================  ===============================================  ====================
artifact                    files                                            loader
==========================  ===============================================  ====================
PyTorch weights             ``<stage>_<hidden>[_moe].pth``: a bare fp16       ``load_pth``
                            ``state_dict`` as upstream's trainers save it
                            (``full_sft_512.pth``, ``full_sft_640_moe.pth``;
                            minimind-3: ``full_sft_768[_moe].pth``)
Hugging Face model folder   ``config.json`` + ``model.safetensors`` or        ``load_hf_dir``
                            ``pytorch_model.bin``, in the layouts upstream's
                            ``scripts/convert_model.py`` writes: Llama
                            (``model_type: llama``, MiniMind2 at c090b69),
                            Qwen3 / Qwen3-MoE (``qwen3``, ``qwen3_moe``,
                            minimind-3 at d65ef2c) and MiniMind's own
                            (``model_type: minimind``, ``auto_map``; the
                            config keys of either commit)
tokenizer                   ``tokenizer.json`` + ``tokenizer_config.json``    ``load_tokenizer_dir``
                            (+ ``chat_template.jinja`` when transformers
                            saved the template separately)
==========================  ===============================================  ====================

``load_pretrained(model, stage)`` puts them together: from a local folder (the ``path``
argument or the ``MINIMIND_WEIGHTS`` environment variable; never the network), or, only when
asked (``download=True``, or by default in Colab), from the Hugging Face Hub with
``huggingface_hub`` (``pip install "minimind-ref[hub]"``). ``load_or_skip`` is the form the
chapters' optional cells use: it prints one line and returns ``None`` when no weights are
available, and it never looks anywhere under pytest/nbval or with ``MINIMIND_REAL_WEIGHTS=off``.

The readers of the files live below this module: ``upstream_weights`` (``load_pth``,
``load_hf_dir``, ``config_from_hf``; what is verified and what is inferred about the files)
and ``upstream_tokenizer`` (``load_tokenizer_dir``, ``render_chat_template``); their names are
importable from here as before. This module owns the registry of the published models
(``MODELS``, the Hub repositories) and finding them: a local folder, or the Hub when asked.

What is verified and what is inferred (details in the book's ``minimind_ref`` page):

* minimind-3's Hub names are upstream's README's: ``jingyaogong/minimind-3`` (the transformers
  folder, ``d65ef2c:README_en.md:243 "huggingface.co/jingyaogong/minimind-3"``),
  ``jingyaogong/minimind-3-pytorch`` (the ``.pth`` files, ``d65ef2c:README_en.md:1282``).
  ``jingyaogong/minimind-3-moe`` is inferred from the model's name in the README's table
  (``d65ef2c:README_en.md:577``): the README links no repository of that name, and d65ef2c's
  ``scripts/convert_model.py`` writes its folder as ``../minimind-3`` whatever the model
  (``d65ef2c:scripts/convert_model.py:133``).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import torch

from .checkpoint import check_tokenizer_fits
from .files import read_json
from .model import MiniMindForCausalLM
# The readers of upstream's files, importable from here as before (``pretrained.load_hf_dir``, ...).
from .upstream_tokenizer import (OPTIONAL_TOKENIZER_FILES, TOKENIZER_FILES, UpstreamTokenizer,  # noqa: F401
                                 load_tokenizer_dir, render_chat_template, tokenizer_folder_generation)
from .upstream_weights import (PUBLISHED_HEADS, PUBLISHED_TOP_K, PUBLISHED_TOP_K_MINIMIND3, PthName,  # noqa: F401
                               _as_state_dict, _read_torch_file, config_from_hf, load_hf_dir, load_pth,
                               parse_pth_name, pth_filename, published_config, read_hf_weights,
                               state_dict_generation)

PathLike = Union[str, "os.PathLike[str]"]

#: The published models: name -> (hidden_size, use_moe, num_hidden_layers).
MODELS: Dict[str, Tuple[int, bool, int]] = {
    "MiniMind2-Small": (512, False, 8),
    "MiniMind2": (768, False, 16),
    "MiniMind2-MoE": (640, True, 8),
    "minimind-3": (768, False, 8),
    "minimind-3-moe": (768, True, 8),
}
#: The generation of each published model (upstream's README at d65ef2c: MiniMind2 is the "historical version").
MODEL_GENERATION: Dict[str, str] = {name: "minimind-3" if name.startswith("minimind-3") else "MiniMind2"
                                    for name in MODELS}

#: Hugging Face Hub repositories (``jingyaogong``'s MiniMind collection).
HUB_PTH_REPO = "jingyaogong/MiniMind2-Pytorch"          # the .pth files (spelled -Pytorch on the Hub)
HUB_MODEL_REPOS = {name: f"jingyaogong/{name}" for name in MODELS}  # transformers-format folders
HUB_TOKENIZER_REPO = "jingyaogong/MiniMind2-Small"       # any MiniMind2 folder holds the same tokenizer
#: Per generation (minimind-3's names from upstream's README at d65ef2c).
HUB_PTH_REPOS = {"MiniMind2": HUB_PTH_REPO, "minimind-3": "jingyaogong/minimind-3-pytorch"}
HUB_TOKENIZER_REPOS = {"MiniMind2": HUB_TOKENIZER_REPO, "minimind-3": "jingyaogong/minimind-3"}

#: The line an optional chapter cell prints when it skips (the same on every machine).
SKIP_NOTE = ("Optional cell skipped: real MiniMind2 weights not found "
             "(set MINIMIND_WEIGHTS=/path/to/folder, or run the chapter in Colab to download them).")
SKIP_NOTES = {"MiniMind2": SKIP_NOTE, "minimind-3": SKIP_NOTE.replace("MiniMind2", "minimind-3")}


class WeightsUnavailable(RuntimeError):
    """No local copy of the requested upstream files, and no way (or no permission) to download them."""


# ---------------------------------------------------------------------- finding and fetching
def fetch(repo_id: str, filename: Optional[str] = None, *, revision: Optional[str] = None,
          cache_dir: Optional[PathLike] = None, allow_patterns: Optional[Sequence[str]] = None) -> Path:
    """Download one file (``filename``) or a whole repository from the Hugging Face Hub; return its
    local path. Needs ``huggingface_hub`` and the network; a ``WeightsUnavailable`` error says
    what to install or which local path to pass instead."""
    try:
        import huggingface_hub
    except ImportError:
        raise WeightsUnavailable(
            f"downloading {repo_id} needs huggingface_hub: pip install \"minimind-ref[hub]\" (or pip install "
            "huggingface_hub); or download the files yourself and pass their folder (path=... or MINIMIND_WEIGHTS)."
        ) from None
    what = f"{repo_id}/{filename}" if filename else repo_id
    try:
        if filename is not None:
            return Path(huggingface_hub.hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache_dir))
        return Path(huggingface_hub.snapshot_download(repo_id, revision=revision, cache_dir=cache_dir,
                                                      allow_patterns=allow_patterns))
    except Exception as err:  # offline, unknown file, hub error: one message with what to do instead
        reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
        reason = reason if len(reason) <= 160 else reason[:160].rsplit(" ", 1)[0] + " ..."
        raise WeightsUnavailable(
            f"could not download {what} from the Hugging Face Hub ({type(err).__name__}: {reason}). Without network, "
            f"fetch https://huggingface.co/{repo_id} elsewhere and pass the local folder (path=... or MINIMIND_WEIGHTS)."
        ) from err


def fetch_tokenizer(repo_id: str = HUB_TOKENIZER_REPO) -> Path:
    """Download upstream's tokenizer files from a model repository (MiniMind2's by default; minimind-3's:
    ``HUB_TOKENIZER_REPOS["minimind-3"]``); return their folder."""
    folder = None
    for name in TOKENIZER_FILES:
        folder = fetch(repo_id, name).parent
    for name in OPTIONAL_TOKENIZER_FILES:
        try:
            fetch(repo_id, name)
        except WeightsUnavailable:
            pass  # optional: older uploads keep the template inside tokenizer_config.json
    return folder


def in_colab() -> bool:
    return "google.colab" in sys.modules


def real_weights_enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """False under pytest (nbval kernels inherit ``PYTEST_VERSION``) and with
    ``MINIMIND_REAL_WEIGHTS=off``: tests and the book build never depend on files outside the repository
    or on the network."""
    env = os.environ if environ is None else environ
    return "PYTEST_VERSION" not in env and env.get("MINIMIND_REAL_WEIGHTS", "").lower() not in ("off", "0", "no")


def _find_tokenizer(folders: Sequence[Path], generation: str = "MiniMind2") -> Path:
    """The first folder holding a tokenizer of ``generation`` (the two generations' vocabularies differ)."""
    folders = list(dict.fromkeys(folders))  # each once, in order
    found = [f for f in folders if all((f / name).is_file() for name in TOKENIZER_FILES)]
    for folder in found:
        if tokenizer_folder_generation(folder) == generation:
            return folder
    other = (f" ({', '.join(str(f) for f in found)} hold the other generation's tokenizer)") if found else ""
    raise WeightsUnavailable(
        f"found {generation} weights but no tokenizer of that generation{other}: put upstream's tokenizer.json and "
        f"tokenizer_config.json (from any {generation} model folder, e.g. {HUB_TOKENIZER_REPOS[generation]}, or "
        f"upstream's model/ at {'c090b69' if generation == 'MiniMind2' else 'd65ef2c'}) next to them. Looked in: "
        + ", ".join(str(f) for f in folders)
    )


def _pth_generation(path: Path, map_location: Union[str, torch.device]) -> str:
    """The generation of an upstream ``.pth`` (from its keys: ``state_dict_generation``)."""
    return state_dict_generation(_as_state_dict(_read_torch_file(path, map_location), path))


def _other_generation_note(path: Path, model: str, found: str) -> str:
    return (f"{path} holds {found}'s weights (its keys {'have' if found == 'minimind-3' else 'lack'} QK-norm), not "
            f"{model}'s: MiniMind2 and minimind-3 use the same file names (full_sft_768.pth is MiniMind2's 104M model "
            "and minimind-3's 64M one); keep each generation's files in a folder of its own")


def _load_local(path: Path, model: str, stage: str, dtype: Optional[torch.dtype],
                map_location: Union[str, torch.device]) -> Tuple[MiniMindForCausalLM, UpstreamTokenizer]:
    hidden, moe, _ = MODELS[model]
    generation = MODEL_GENERATION.get(model, "MiniMind2")
    filename = pth_filename(stage, hidden, moe)
    if path.is_file():
        if path.name != filename:
            raise WeightsUnavailable(f"{path} is not {model}'s {stage} weights ({filename}).")
        found = _pth_generation(path, map_location)
        if found != generation:
            raise WeightsUnavailable(_other_generation_note(path, model, found) + ".")
        tokenizer = _find_tokenizer([path.parent, path.parent / "model"], generation)
        return load_pth(path, dtype, map_location), load_tokenizer_dir(tokenizer)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} does not exist (MINIMIND_WEIGHTS or path= must name a folder or a .pth file).")
    note = ""
    for pth_dir in (path, path / model):
        if (pth_dir / filename).is_file():
            found = _pth_generation(pth_dir / filename, map_location)
            if found != generation:
                note = "; " + _other_generation_note(pth_dir / filename, model, found)
                continue
            folders = [pth_dir, path, path / "model", *(path / name for name in MODELS)]
            return load_pth(pth_dir / filename, dtype, map_location), load_tokenizer_dir(_find_tokenizer(folders, generation))
    for hf_dir in (path / model, path):
        if stage == "full_sft" and (hf_dir / "config.json").is_file():
            with warnings.catch_warnings():  # a missing field is reported once, by load_hf_dir below
                warnings.simplefilter("ignore")
                cfg = config_from_hf(read_json(hf_dir / "config.json", "config.json"))
            if (cfg.hidden_size, cfg.use_moe, cfg.generation) == (hidden, moe, generation):
                return (load_hf_dir(hf_dir, dtype, map_location),
                        load_tokenizer_dir(_find_tokenizer([hf_dir, path], generation)))
    raise WeightsUnavailable(
        f"{model} ({stage}) is not in {path}: expected {filename} there"
        + (f", or a {model}/ model folder (git clone https://huggingface.co/{HUB_MODEL_REPOS[model]})"
           if stage == "full_sft" else "") + note + "."
    )


def _matched(pair: Tuple[MiniMindForCausalLM, UpstreamTokenizer], source: PathLike
             ) -> Tuple[MiniMindForCausalLM, UpstreamTokenizer]:
    """``pair`` after checking that its tokenizer belongs to its model (``check_tokenizer_fits``)."""
    check_tokenizer_fits(pair[0].config, pair[1], source)
    return pair


def load_pretrained(model: str = "MiniMind2-Small", stage: str = "full_sft", path: Optional[PathLike] = None,
                    download: Optional[bool] = None, dtype: Optional[torch.dtype] = torch.float32,
                    map_location: Union[str, torch.device] = "cpu") -> Tuple[MiniMindForCausalLM, UpstreamTokenizer]:
    """Upstream's trained ``model`` at ``stage`` and its tokenizer.

    ``model`` is a published model (``MODELS``): ``MiniMind2-Small``, ``MiniMind2``, ``MiniMind2-MoE``
    (c090b69) or ``minimind-3``, ``minimind-3-moe`` (d65ef2c). Looked up in ``path`` (a folder or a
    ``.pth`` file), else in ``$MINIMIND_WEIGHTS``: the file ``<stage>_<hidden>[_moe].pth`` (as in
    ``jingyaogong/MiniMind2-Pytorch`` / ``jingyaogong/minimind-3-pytorch``) in the folder or in its
    ``<model>/``, or for ``full_sft`` also a transformers folder ``<model>/`` (as ``git clone
    https://huggingface.co/jingyaogong/<model>`` makes); the tokenizer of the same generation from the
    same folder, its ``model/`` or a ``<model>/`` folder inside. A ``.pth`` of the other generation
    under the shared name (``full_sft_768.pth``) is recognised by its keys and skipped with a note.
    With neither, downloads from the Hub when ``download`` is true (default: only in Colab): the
    ``.pth`` from ``HUB_PTH_REPOS[generation]``, the tokenizer from ``HUB_TOKENIZER_REPOS[generation]``.
    Otherwise raises ``WeightsUnavailable`` saying what to do.
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; the published models are {list(MODELS)} (MiniMind2 at c090b69, "
                         "minimind-3 at d65ef2c).")
    if path is None and os.environ.get("MINIMIND_WEIGHTS"):
        path = os.environ["MINIMIND_WEIGHTS"]
    if path is not None:
        return _matched(_load_local(Path(os.path.expanduser(os.fspath(path))), model, stage, dtype, map_location), path)
    if download is None:
        download = in_colab() or os.environ.get("MINIMIND_DOWNLOAD") == "1"
    if not download:
        raise WeightsUnavailable(
            f"no local {model} weights: set MINIMIND_WEIGHTS=/path/to/folder (holding "
            f"{pth_filename(stage, *MODELS[model][:2])} and upstream's tokenizer files), pass path=..., or pass "
            "download=True (needs huggingface_hub and the network)."
        )
    hidden, moe, _ = MODELS[model]
    generation = MODEL_GENERATION.get(model, "MiniMind2")
    weights = fetch(HUB_PTH_REPOS[generation], pth_filename(stage, hidden, moe))
    loaded = load_pth(weights, dtype, map_location)
    if loaded.config.generation != generation:
        raise WeightsUnavailable(_other_generation_note(weights, model, loaded.config.generation) + ".")
    return _matched((loaded, load_tokenizer_dir(fetch_tokenizer(HUB_TOKENIZER_REPOS[generation]))), weights)


def load_or_skip(model: str = "MiniMind2-Small", stage: str = "full_sft",
                 **kwargs: Any) -> Optional[Tuple[MiniMindForCausalLM, UpstreamTokenizer]]:
    """``load_pretrained(...)`` for the chapters' optional cells, or ``None`` after printing one
    line: when disabled (pytest/nbval, ``MINIMIND_REAL_WEIGHTS=off``), when nothing is configured
    (no ``MINIMIND_WEIGHTS``, not in Colab) or when the files are not there. Errors in files that
    are there (corrupt, wrong model) are raised. Either generation: ``load_or_skip("minimind-3")``."""
    note = SKIP_NOTES[MODEL_GENERATION.get(model, "MiniMind2")]
    if not real_weights_enabled():
        print(note)
        return None
    try:
        return load_pretrained(model, stage, **kwargs)
    except WeightsUnavailable as err:
        configured = bool(os.environ.get("MINIMIND_WEIGHTS")) or in_colab() or kwargs.get("download")
        print(f"Optional cell skipped: {err}" if configured else note)
        return None
