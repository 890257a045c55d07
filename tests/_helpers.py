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


# ------------------------------------------------------------------------------------------
# What a check's failure must not contain (CONTRIBUTING.md, "Checks"): the guard of tests/conftest.py
# ------------------------------------------------------------------------------------------
import re as _re

_TOKEN = _re.compile(r"""
    (?P<str>'[^'\n]*'|"[^"\n]*")
   |(?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
   |(?P<name>[A-Za-z_][A-Za-z_0-9]*(?:\.[A-Za-z_][A-Za-z_0-9]*)*)
   |(?P<op>\*\*|//|<=|>=|==|!=|\+=|-=|\*=|/=|[-+*/@<>%=])
   |(?P<punct>\.\.\.|[()\[\]{},:])
""", _re.X)
_BINARY = {"+", "-", "*", "/", "**", "//", "@", "%", "<", "<=", ">", ">=", "==", "!=", "+=", "-=", "*=", "/="}
_NOT_LEFT = {None, "(", "[", "{", ",", ":", "="} | _BINARY


def _tokens(text: str) -> list:
    """``(kind, value, start, end)`` of the code-like tokens of ``text`` (words, numbers, operators); a
    minus sign written against a number after an operator, an opening bracket, a comma or ``=`` is part
    of the number (``dim=-1``, ``clamp(-10, 10)``)."""
    raw = [(m.lastgroup, m.group(), m.start(), m.end()) for m in _TOKEN.finditer(text)]
    out = []
    i = 0
    while i < len(raw):
        kind, value, start, end = raw[i]
        nxt = raw[i + 1] if i + 1 < len(raw) else None
        prev = out[-1] if out else None
        if value == "-" and nxt is not None and nxt[0] == "num" and nxt[2] == end and (
                prev is None or prev[1] in _NOT_LEFT or prev[1] in _BINARY):
            out.append(("num", "-" + nxt[1], start, nxt[3]))
            i += 2
            continue
        out.append(raw[i])
        i += 1
    return out


def _norm(kind: str, value: str) -> str:
    """A token as fragments compare it: a dotted name by its last part (``torch.rsqrt`` is ``rsqrt``,
    ``config.hidden_size`` is ``hidden_size``), and a one-letter name as any name (a solution's ``h``
    is the message's ``hidden_size``)."""
    if kind == "name":
        last = value.rsplit(".", 1)[-1]
        return "<name>" if len(last) == 1 else last
    return value


_OPERAND = {"name", "num", "str"}


def solution_fragments(recipe: str) -> set:
    """The pieces of code a worked solution is made of, which no failure of its exercise may contain:

    * every binary operation with its two operands (``x / sqrt``, ``h // 8``, ``<= max_no_signal``,
      ``1 - s``, ``) + eps``): the operator together with what it joins;
    * every call of a qualified or well-known function, name and opening parenthesis adjacent
      (``rsqrt(``, ``clamp(``, ``repeat_interleave(``);
    * every keyword argument with its value, written without spaces (``keepdim=True``, ``dim=-1``);
    * every subscript (``[:, :-1]``, ``[..., half:]``), spaces ignored.

    Binary operations are tuples of normalized tokens (``_norm``), calls ``("call", name)``, keyword
    arguments ``("kw", name, value)``, subscripts their text."""
    toks = _tokens(recipe)
    out = set()
    for i, (kind, value, start, end) in enumerate(toks):
        prev = toks[i - 1] if i > 0 else None
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        if kind == "op" and value in _BINARY and prev is not None and nxt is not None:
            if (prev[0] in _OPERAND or prev[1] in (")", "]")) and (nxt[0] in _OPERAND or nxt[1] == "("):
                out.add((_norm(prev[0], prev[1]), value, _norm(nxt[0], nxt[1])))
        elif kind == "name" and nxt is not None and nxt[1] == "(" and nxt[2] == end:
            last = value.rsplit(".", 1)[-1]
            if "." in value or last in _CALLS:
                out.add(("call", last))
        elif kind == "op" and value == "=" and prev is not None and prev[0] == "name" and nxt is not None \
                and prev[3] == start and nxt[2] == end and nxt[0] in _OPERAND:
            out.add(("kw", prev[1], nxt[1]))
        elif value == "[" and prev is not None and prev[3] == start:
            depth = 0
            for j in range(i, len(toks)):
                depth += toks[j][1] == "["
                depth -= toks[j][1] == "]"
                if depth == 0:
                    out.add(_re.sub(r"\s+", "", recipe[start:toks[j][3]]))
                    break
    return out


_CALLS = {"sqrt", "rsqrt", "exp", "log", "ceil", "floor", "min", "max", "clamp", "clamp_min", "softmax", "sigmoid",
          "log_softmax", "logsigmoid", "sum", "mean", "std", "var", "cat", "stack", "where", "topk", "sort", "cumsum",
          "masked_fill", "scatter", "gather", "triu", "tril", "full", "arange", "outer", "repeat_interleave", "linear",
          "cross_entropy", "one_hot", "bincount", "argsort", "index_add_", "view", "reshape", "transpose", "next",
          "range", "round", "abs", "half", "detach", "silu", "relu", "pow"}


def _same_token(fragment: str, token: str) -> bool:
    if fragment == token:
        return True
    is_name = lambda t: t == "<name>" or bool(_re.fullmatch(r"[A-Za-z_]\w*", t))  # noqa: E731
    return (fragment == "<name>" and is_name(token)) or (token == "<name>" and is_name(fragment))


def fragments_in(message: str, fragments: set) -> list:
    """The fragments of a solution (``solution_fragments``) that ``message`` contains."""
    toks = _tokens(message)
    compact = _re.sub(r"\s+", "", message)
    found = []
    for fragment in fragments:
        if isinstance(fragment, str):
            hit = fragment in compact
        elif fragment[0] == "call":
            hit = any(kind == "name" and value.rsplit(".", 1)[-1] == fragment[1] and i + 1 < len(toks)
                      and toks[i + 1][1] == "(" and toks[i + 1][2] == end
                      for i, (kind, value, start, end) in enumerate(toks))
        elif fragment[0] == "kw":
            hit = any(toks[i][1] == fragment[1] and toks[i + 1][1] == "=" and toks[i + 2][1] == fragment[2]
                      and toks[i][3] == toks[i + 1][2] and toks[i + 1][3] == toks[i + 2][2]
                      for i in range(len(toks) - 2))
        else:
            hit = any(toks[i + 1][1] == fragment[1] and _same_token(fragment[0], _norm(*toks[i][:2]))
                      and _same_token(fragment[2], _norm(*toks[i + 2][:2]))
                      for i in range(len(toks) - 2))
        if hit:
            found.append(fragment if isinstance(fragment, str) else " ".join(fragment))
    return found


def _number_forms(value) -> set:
    """How a reference value would be printed in a failure: enough to recognise it, without matching
    small integers that any message contains (indices, counts of cases)."""
    forms = set()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return forms
    if isinstance(value, int) or float(value).is_integer():
        v = int(value)
        if abs(v) >= 100:
            forms |= {str(v), f"{v:,}"}
        return forms
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")):
        return forms
    for spec in (".6g", ".4g"):
        text = format(v, spec)
        if len(text.lstrip("-").replace(".", "").lstrip("0")) >= 3:  # 0.5 or 4.1 would match too much
            forms.add(text)
    return forms


def answer_shown(message: str, expected=()) -> list:
    """Why a check's failure ``message`` gives the answer away (empty list: it does not):

    * the worked solution of its exercise (``minimind_ref.checks.show_solution``), in English or in the
      language the message is in, appears in it, or an old-style "if you are stuck:" line does;
    * a piece of the solution's code appears in it (``solution_fragments``): an operator with its
      operands, a call, a keyword argument, a subscript;
    * the exercise hides the reference's values (``expected_values(..., shown=False)``) and the message
      contains one of ``expected``, the values the failing comparison expected (``core._last_expected``);
    * a message of an exercise with a registered solution does not end with the line that says how to ask."""
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
        body = message.rstrip("\n").rsplit("\n", 1)[0] if "show_solution" in message else message
        for fragment in fragments_in(body, solution_fragments(recipe)):
            problems.append(f"a piece of the solution of exercise {number} is in the message: {fragment!r}")
        last = message.rstrip("\n").rsplit("\n", 1)[-1]
        if f'show_solution("{number}")' not in last:
            problems.append(f"the last line does not say how to ask for the solution: {last!r}")
    if number and not core._VALUES.get(number, (True, ""))[0]:
        text = _re.sub(r"^\[[^\]]*\]", "", message)  # not the exercise's own number in "[Exercise 4.1 silu]"
        numbers = set(_re.findall(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?", text))
        for value in expected:
            hit = _number_forms(value) & numbers
            if hit:
                problems.append(f"exercise {number} hides the reference's values, and the message shows {sorted(hit)[0]}")
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
