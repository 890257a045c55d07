"""Small shared builders for the package tests."""

import socket

import pytest
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


def answer_shown(message: str) -> list:
    """Why a check's failure ``message`` gives the answer away (empty list: it does not): the
    worked solution of its exercise (``minimind_ref.checks.show_solution``), in English or in the
    language the message is in, appears in it, or an old-style "if you are stuck:" line does; and a
    message of an exercise with a registered solution must end with the line that says how to ask."""
    from minimind_ref import i18n
    from minimind_ref.checks import core

    problems = []
    first = message.split("\n", 1)[0]
    number = core.exercise_number(first) or core.exercise_number(first.replace("练习", "Exercise"))
    recipe = core._SOLUTIONS.get(number) if number else None
    if recipe:
        for text in {recipe, i18n.translate(recipe, "zh_CN")}:
            if text in message:
                problems.append(f"the solution of exercise {number} is in the message")
        last = message.rstrip("\n").rsplit("\n", 1)[-1]
        if f'show_solution("{number}")' not in last:
            problems.append(f"the last line does not say how to ask for the solution: {last!r}")
    for label in ("if you are stuck", "如果卡住了"):
        if label in message:
            problems.append(f"{label!r} in the message")
    return problems


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any attempt to open a network connection fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.delenv("MINIMIND_WEIGHTS", raising=False)
    monkeypatch.delenv("MINIMIND_DOWNLOAD", raising=False)
    monkeypatch.delenv("MINIMIND_REAL_WEIGHTS", raising=False)
