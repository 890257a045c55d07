"""minimind_ref: MiniMind (jingyaogong/minimind) in pure PyTorch, both generations upstream has
shipped (MiniMind2, c090b69, and minimind-3, d65ef2c), the reference of the course "MiniMind from
Zero". One module per concept (each generation's differences are config switches):

=================  ==========================================  =========
module             what                                        chapter
=================  ==========================================  =========
``config``         MiniMindConfig, presets, generations        05
``norm``           RMSNorm                                     01
``rope``           precompute_freqs_cis, apply_rotary_pos_emb  02
``attention``      repeat_kv, Attention (SDPA + explicit),     03
                   QK-norm (minimind-3)
``ffn``            FeedForward (SwiGLU)                        04
``model``          MiniMindBlock, MiniMindModel, ...ForCausalLM 05
``generation``     generate, sampling filters                  06
``cache``          KV-cache format, preallocated GrowingKV      06
``graph_decode``   GraphDecoder: static KV cache, CUDA graphs   06
``moe``            MoEGate, MOEFeedForward, aux losses,         07
                   minimind-3's router
``params``         count_parameters, parameter_breakdown       05
``checkpoint``     save_checkpoint, load_checkpoint            05, 08
``data``           generated corpus, packed datasets           08
``tokenizer``      BPE from scratch and with ``tokenizers``    08
``train``          training loop (``python -m``, torchrun)     08
``distributed``    the loop's processes and device (torchrun)  08
``run_state``      resume, kept checkpoints, divergence        08
``hf``             to/from transformers: Llama (MiniMind2),    perf.
                   Qwen3(-MoE) (minimind-3); extra ``hf``
``pretrained``     upstream's published files, both            03-09
                   generations (.pth, HF folders, tokenizer)
``checks``         exercise checks                             all
=================  ==========================================  =========
"""

from .attention import Attention, repeat_kv
from .checkpoint import infer_config, load_checkpoint, load_state_dict_strict, save_checkpoint
from .config import (PRESETS, MiniMindConfig, minimind2, minimind2_moe, minimind2_small, minimind3, minimind3_moe,
                     preset)
from .ffn import FeedForward
from .generation import generate
from .model import CausalLMOutput, MiniMindBlock, MiniMindForCausalLM, MiniMindModel
from .moe import MoEGate, MOEFeedForward
from .norm import RMSNorm
from .params import active_parameters, count_parameters, parameter_breakdown
from .rope import apply_rotary_pos_emb, precompute_freqs_cis, rotate_half
from .utils import pick_device, seed_everything

__version__ = "0.1.0"

__all__ = [
    "Attention", "CausalLMOutput", "FeedForward", "MiniMindBlock", "MiniMindConfig", "MiniMindForCausalLM",
    "MiniMindModel", "MoEGate", "MOEFeedForward", "PRESETS", "RMSNorm", "active_parameters",
    "apply_rotary_pos_emb", "count_parameters", "generate", "infer_config", "load_checkpoint",
    "load_state_dict_strict", "minimind2", "minimind2_moe", "minimind2_small", "minimind3", "minimind3_moe",
    "parameter_breakdown",
    "pick_device", "precompute_freqs_cis", "preset", "repeat_kv", "rotate_half", "save_checkpoint",
    "seed_everything",
]
