"""Small shared builders for the package tests."""

import torch

import minimind_ref as mm


def tiny_config(**overrides) -> mm.MiniMindConfig:
    base = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=61, max_position_embeddings=64, intermediate_size=64)
    base.update(overrides)
    return mm.MiniMindConfig(**base)


def tiny_model(seed: int = 0, **overrides) -> mm.MiniMindForCausalLM:
    torch.manual_seed(seed)
    return mm.MiniMindForCausalLM(tiny_config(**overrides)).eval()


def rand_ids(batch: int, seq: int, vocab: int = 61, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def stub(*args, **kwargs):
    """An exercise as the student edition ships it, before it is solved."""
    raise NotImplementedError("exercise stub")


def check_fails(check, fn, *fragments: str) -> str:
    """``check(fn)`` must raise ``ExerciseError`` whose message holds every fragment (plain text);
    returns the message."""
    import pytest

    from minimind_ref.checks.core import ExerciseError

    with pytest.raises(ExerciseError) as info:
        check(fn)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message
