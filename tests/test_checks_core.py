"""The exercise machinery itself must catch wrong answers and explain them."""

import pytest
import torch

from minimind_ref.checks import ExerciseError, call, check, check_close, check_equal, exercise


def test_check_close_accepts_equal_and_within_tolerance():
    x = torch.randn(3, 4)
    check_close(x.clone(), x, name="Exercise 0.1")
    check_close(x + 5e-7, x, name="Exercise 0.1")


@pytest.mark.parametrize(
    "got, fragment",
    [
        ([1.0, 2.0], "expected a torch.Tensor"),
        (torch.zeros(3), r"shape mismatch: expected \(3, 4\), got \(3,\)"),
        (torch.zeros(3, 4, dtype=torch.float64), "dtype mismatch"),
        (torch.full((3, 4), float("nan")), "your result has NaN at 12 of 12 positions"),
        (torch.ones(3, 4), "values differ at 12 of 12 positions"),
    ],
)
def test_check_close_rejects_with_specific_message(got, fragment):
    with pytest.raises(AssertionError, match=fragment):
        check_close(got, torch.zeros(3, 4), name="Exercise 0.2", hint="look again")


def test_check_close_reports_first_mismatch_and_hint():
    expected = torch.zeros(2, 3)
    got = expected.clone(); got[1, 2] = 0.5
    with pytest.raises(ExerciseError) as err:
        check_close(got, expected, name="Exercise 0.3", hint="check the axis")
    msg = str(err.value)
    assert "[Exercise 0.3]" in msg and "index (1, 2)" in msg and "max abs diff 0.5" in msg and "hint: check the axis" in msg


def test_check_close_explicit_tolerance():
    check_close(torch.ones(2) * 1.01, torch.ones(2), rtol=0, atol=0.02)
    with pytest.raises(AssertionError):
        check_close(torch.ones(2) * 1.01, torch.ones(2), rtol=0, atol=0.001)


def test_infinities_equal_are_fine():
    t = torch.tensor([float("-inf"), 1.0])
    check_close(t.clone(), t)
    with pytest.raises(AssertionError):
        check_close(torch.tensor([0.0, 1.0]), t)


def test_check_equal():
    check_equal(3, 3)
    with pytest.raises(AssertionError, match="expected 3, got 4"):
        check_equal(4, 3, name="count")
    with pytest.raises(AssertionError):
        check_equal(torch.tensor([1, 2]), torch.tensor([1, 3]))


def test_stub_becomes_assertion_error():
    def stub(x):
        raise NotImplementedError("Exercise 1.1: implement rms_norm")

    with pytest.raises(AssertionError, match="not implemented yet: Exercise 1.1"):
        call(stub, 1, name="Exercise 1.1")
    with pytest.raises(AssertionError, match="not implemented"):
        with exercise("Exercise 1.1"):
            stub(1)


def test_learner_crash_is_reported():
    with pytest.raises(AssertionError, match="your function raised ZeroDivisionError"):
        call(lambda: 1 / 0, name="Exercise 1.2")


def test_check_decorator_prints_success(capsys):
    @check("Exercise 9.9")
    def check_thing(fn):
        check_equal(fn(), 1, name="Exercise 9.9")
        return "1 case"

    check_thing(lambda: 1)
    assert capsys.readouterr().out.strip() == "✓ Exercise 9.9 passed: 1 case"
    with pytest.raises(AssertionError):
        check_thing(lambda: 2)


def test_scalar_mismatch_reads_like_a_number():
    with pytest.raises(ExerciseError) as err:
        check_close(torch.tensor(1.5), torch.tensor(1.0), name="Exercise 0.4")
    msg = str(err.value)
    assert "expected 1, got 1.5" in msg and "index ()" not in msg and "positions" not in msg


def test_nan_is_reported_as_nan_not_as_a_small_difference():
    got = torch.tensor([0.0, float("nan"), 1.0])
    with pytest.raises(ExerciseError, match=r"your result has NaN at 1 of 3 positions at index \(1,\)"):
        check_close(got, torch.tensor([0.0, 0.0, 1.0]), name="Exercise 0.5")


def test_missing_minus_infinity_is_explained():
    expected = torch.tensor([float("-inf"), 2.0])
    with pytest.raises(ExerciseError, match="the reference removes this entry with -inf"):
        check_close(torch.tensor([1.5, 2.0]), expected, name="Exercise 0.6")


def test_known_mistake_is_named_before_the_hint_and_how_to_ask_comes_last():
    from minimind_ref.checks import core

    x = torch.tensor([3.0, 4.0])
    expected = x / x.pow(2).mean().add(1e-6).sqrt()
    wrong = x / x.pow(2).mean().sqrt() * 2
    core.solution("0.7", "x / sqrt(mean(x^2) + eps)")
    try:
        with pytest.raises(ExerciseError) as err:
            check_close(wrong, expected, name="Exercise 0.7", hint="look at the scale",
                        mistakes={"a result scaled by 2": lambda: x / x.pow(2).mean().sqrt() * 2,
                                  "never matching": torch.zeros(2)})
    finally:
        del core._SOLUTIONS["0.7"]
    msg = str(err.value)
    assert msg.index("this looks like a result scaled by 2") < msg.index("hint: look at the scale") < msg.index(
        'show_solution("0.7")')
    assert "sqrt(mean" not in msg


def test_crash_reports_the_case_and_the_hint():
    with pytest.raises(ExerciseError) as err:
        call(lambda x: x @ x, torch.zeros(2, 3), name="Exercise 0.8", hint="mind the transpose", case="input (2, 3)")
    msg = str(err.value)
    assert "your function raised RuntimeError" in msg and "(on input (2, 3))" in msg and "hint: mind the transpose" in msg


def test_in_place_edits_are_caught_when_asked():
    def edits(ids):
        ids[0] = 9
        return ids

    with pytest.raises(ExerciseError, match="changed its input"):
        call(edits, [1, 2], name="Exercise 0.9", check_inputs=True)
    with pytest.raises(ExerciseError, match="changed its input"):
        call(lambda t: t.mul_(2), torch.ones(2), name="Exercise 0.9", check_inputs=True)
    assert call(lambda ids: ids + [3], [1, 2], name="Exercise 0.9", check_inputs=True) == [1, 2, 3]


def test_check_equal_names_a_known_mistake_with_case_and_no_solution_line_without_one():
    with pytest.raises(ExerciseError) as err:
        check_equal(16, 17, name="Exercise 0.10", hint="count again", case="8 layers",
                    mistakes={"never this": 3, "the final norm forgotten": lambda: 16, "a float": 16.0})
    msg = str(err.value)
    assert msg.startswith("[Exercise 0.10] this looks like the final norm forgotten: expected 17, got 16 (on 8 layers)")
    assert msg.endswith("hint: count again"), "no solution registered for 0.10: no line about asking for one"


def test_check_equal_mistakes_compare_types_and_skip_failing_thunks():
    with pytest.raises(ExerciseError) as err:
        check_equal(1, 2, name="Exercise 0.11", mistakes={"a bool": True, "a crash": lambda: 1 / 0})
    assert "this looks like" not in str(err.value)


def test_a_mistake_indistinguishable_from_the_answer_is_not_named():
    expected = torch.tensor([1.0, 2.0])
    got = torch.tensor([1.0, 2.5])
    with pytest.raises(ExerciseError) as err:
        check_close(got, expected, name="Exercise 0.12",
                    mistakes={"equal to the answer on this input": torch.tensor([1.0, 2.0 + 1e-7]),
                              "the real mistake": torch.tensor([1.0, 2.5])})
    assert "this looks like the real mistake" in str(err.value)


def test_a_mistake_of_another_dtype_is_not_named():
    expected = torch.tensor([1.0, 2.0], dtype=torch.float16)
    got = torch.tensor([1.0, 2.5], dtype=torch.float16)
    with pytest.raises(ExerciseError) as err:
        check_close(got, expected, name="Exercise 0.13", mistakes={"a float32 result": torch.tensor([1.0, 2.5])})
    assert "this looks like" not in str(err.value)


def test_in_place_edits_inside_a_tuple_argument_are_caught():
    cache = (torch.zeros(2), torch.ones(2))

    def edits_cache(x, past):
        past[0].add_(1)
        return x

    with pytest.raises(ExerciseError, match=r"changed its input \(argument 2\) in place"):
        call(edits_cache, torch.ones(2), cache, name="Exercise 0.14", check_inputs=True)
    assert call(lambda x, past: x + past[1], torch.ones(2), (torch.zeros(2), torch.ones(2)), name="Exercise 0.14",
                check_inputs=True).tolist() == [2.0, 2.0]
    assert call(lambda x, shape: x, torch.ones(2), (2, 3), name="Exercise 0.14", check_inputs=True).tolist() == [1.0, 1.0]


# ----------------------------------------------------------------------------------- solutions on request
def test_a_failure_ends_with_how_to_ask_and_never_shows_the_solution(capsys):
    from minimind_ref.checks import ch04
    from minimind_ref.checks.core import show_solution

    with pytest.raises(ExerciseError) as err:
        ch04.check_silu(torch.sigmoid)
    msg = str(err.value)
    assert msg.splitlines()[-1] == '  stuck? minimind_ref.checks.show_solution("4.1") prints a solution', msg
    assert "x * torch.sigmoid(x)" not in msg
    show_solution("4.1")
    assert capsys.readouterr().out == "Exercise 4.1, one way to write it:\n    return x * torch.sigmoid(x)\n"


def test_show_solution_imports_the_chapter_and_rejects_unknown_numbers(capsys):
    import importlib
    import sys

    from minimind_ref.checks import core

    saved = {k: v for k, v in core._SOLUTIONS.items()}
    try:
        for number in [n for n in core._SOLUTIONS if n.startswith("9.")]:
            del core._SOLUTIONS[number]
        sys.modules.pop("minimind_ref.checks.ch09", None)
        core.show_solution("9.2")  # a fresh kernel: the chapter's checks are imported on demand
        assert capsys.readouterr().out.startswith("Exercise 9.2, one way to write it:")
        core.show_solution(9.1)  # a float is read as its digits
        assert capsys.readouterr().out.startswith("Exercise 9.1")
    finally:
        core._SOLUTIONS.update(saved)
        importlib.import_module("minimind_ref.checks.ch09")
    with pytest.raises(ValueError, match=r"no exercise 9\.7 \(this chapter's exercises: 9\.1, 9\.2, 9\.3, 9\.4, 9\.5, 9\.6\)"):
        core.show_solution("9.7")
    with pytest.raises(ValueError, match="no exercise 42.1"):
        core.show_solution("42.1")
    with pytest.raises(ValueError, match='show_solution\\("9.1"\\)'):
        core.show_solution("nine")
    with pytest.raises(ValueError, match="a string like '9.1'"):
        core.solution(9, "x")


def test_the_guard_of_the_check_tests_sees_a_give_away():
    from _helpers import answer_shown
    from minimind_ref.checks import ch04  # noqa: F401  (registers 4.1)

    ok = ('[Exercise 4.1 silu] expected 1, got 2\n  hint: look again\n'
          '  stuck? minimind_ref.checks.show_solution("4.1") prints a solution')
    assert answer_shown(ok) == []
    leaked = ok.replace("look again", "return x * torch.sigmoid(x)")
    assert any("solution of exercise 4.1" in p for p in answer_shown(leaked))
    assert any("last line" in p for p in answer_shown("[Exercise 4.1 silu] expected 1, got 2\n  hint: look again"))
    assert any("if you are stuck" in p for p in answer_shown("[Exercise 0.1] x\n  if you are stuck: y"))


# ---------------------------------------------------------------------- what a failure may show (issue 37)
import importlib  # noqa: E402

from _helpers import answer_shown, fragments_in, solution_fragments  # noqa: E402
from minimind_ref.checks import Outcome, check_numbers, core, expected_values, solution  # noqa: E402

OUR_CHAPTERS = ("01", "02", "03", "04", "05", "06", "07", "08", "10", "11", "12")


@pytest.fixture
def exercise_0_97():
    """A throw-away exercise 0.97 with a registered solution; removed again afterwards."""
    solution("0.97", "d = h // 8; return next(G for G in range(2, 65) if p**G + (1 - p)**G <= max_no_signal)")
    yield "Exercise 0.97 demo"
    core._SOLUTIONS.pop("0.97", None)
    core._VALUES.pop("0.97", None)


def test_solution_fragments_are_operators_with_operands_calls_keywords_and_subscripts():
    fragments = solution_fragments("weight * x / torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps); logits[:, :-1]")
    assert ("weight", "*", "<name>") in fragments and (")", "+", "eps") in fragments
    assert ("call", "rsqrt") in fragments and ("kw", "keepdim", "True") in fragments and "[:,:-1]" in fragments


@pytest.mark.parametrize("message, leaks", [
    ("try G = 2, 3, ... until p**G + (1 - p)**G <= max_no_signal", True),
    ("head_dim = hidden_size // 8", True),          # a one-letter name of the solution stands for any name
    ("use next(...) over the sizes", True),         # a call of the solution
    ("the chance that all G rewards are equal must be within the bound", False),
    ("8 query heads of head_dim values each", False),
    ("the sum (of the two chances) is too large", False),  # "sum (" in prose is not a call
])
def test_the_guard_finds_the_solutions_code_in_a_message(exercise_0_97, message, leaks):
    text = f"[{exercise_0_97}] {message}\n  stuck? minimind_ref.checks.show_solution(\"0.97\") prints a solution"
    assert bool(answer_shown(text)) == leaks, answer_shown(text)


def test_a_hidden_exercise_shows_no_expected_value(exercise_0_97):
    expected_values("0.97", shown=False, why="a closed form of the case's numbers")
    with pytest.raises(ExerciseError) as err:
        check_equal(13_056, 14_592, name=exercise_0_97, case="minimind-3")
    msg = str(err.value)
    assert "14592" not in msg and "14,592" not in msg and "yours is smaller than the reference's" in msg
    assert not answer_shown(msg, [14_592])
    assert answer_shown(msg.replace("13,056", "14,592"), [14_592]), "the guard sees a hidden value in a message"
    with pytest.raises(ExerciseError) as err:
        check_close(torch.tensor(0.75), torch.tensor(0.123456), name=exercise_0_97)
    assert "0.123456" not in str(err.value) and "yours is larger" in str(err.value)


def test_a_shown_exercise_shows_the_expected_value(exercise_0_97):
    expected_values("0.97", shown=True, why="one entry of random tensors")
    with pytest.raises(ExerciseError, match="expected 14,592, got 13,056"):
        check_equal(13_056, 14_592, name=exercise_0_97)


def test_check_numbers_names_the_mistake_that_explains_every_case(exercise_0_97):
    # on the first case both mistakes give 12; only "b" explains the second case too
    outcomes = [Outcome("case 1", 12, 10, {"a": 12, "b": 12}), Outcome("case 2", 30, 20, {"a": 21, "b": 30})]
    with pytest.raises(ExerciseError) as err:
        check_numbers(exercise_0_97, outcomes)
    assert "this looks like b:" in str(err.value) and "a:" not in str(err.value)
    # two mistakes that agree on every case are both named; a mistake that does not apply to a case
    # (None) must leave that case right
    outcomes = [Outcome("case 1", 12, 10, {"a": 12, "b": 12}), Outcome("case 2", 20, 20, {"a": None, "b": 20})]
    with pytest.raises(ExerciseError, match="this looks like a, or b"):
        check_numbers(exercise_0_97, outcomes)
    check_numbers(exercise_0_97, [Outcome("case", 2.0, 2.0 + 1e-9, {"a": 3.0})], rel_tol=1e-6)


def test_every_exercise_declares_which_values_its_failures_show():
    """Each exercise with a registered solution in this branch's chapters says whether its failures may
    show the reference's values, and why (CONTRIBUTING.md, "What a failure may show")."""
    for chapter in OUR_CHAPTERS:
        importlib.import_module(f"minimind_ref.checks.ch{chapter}")
    numbers = [n for n in core._SOLUTIONS if n.split(".")[0].zfill(2) in OUR_CHAPTERS]
    assert len(numbers) >= 50, numbers
    missing = [n for n in numbers if n not in core._VALUES]
    assert not missing, f"exercises without expected_values(...): {missing}"
    for number in numbers:
        shown, why = core._VALUES[number]
        assert isinstance(shown, bool) and len(why) > 20, (number, why)


def test_expected_values_refuses_a_bad_declaration():
    with pytest.raises(ValueError, match="like '9.1'"):
        expected_values("ex 1", shown=True, why="because")
    with pytest.raises(ValueError, match="say why"):
        expected_values("0.96", shown=False, why=" ")


def test_fragments_in_ignores_prose_that_looks_like_code():
    fragments = solution_fragments("return max(0, (memory_bytes - weights) // per_token)")
    assert not fragments_in("the weights (in bytes) leave room for the cache; max out the tokens", fragments)
    assert fragments_in("(memory_bytes - weights) // per_token", fragments)


def test_a_check_declares_its_exercise_values_where_it_is_defined(exercise_0_97):
    """``@check(name, shown=..., why=...)`` is ``expected_values`` for the exercise ``name`` names (the
    chapters declare it so, beside each check), and refuses a declaration it cannot file."""
    from minimind_ref.checks import check

    @check(exercise_0_97, shown=False, why="a closed form of the case's numbers")
    def check_demo(fn):
        return fn()

    assert core._VALUES["0.97"] == (False, "a closed form of the case's numbers")
    with pytest.raises(ExerciseError) as err:
        check_demo(lambda: check_equal(13_056, 14_592, name=exercise_0_97))
    assert "14592" not in str(err.value) and "14,592" not in str(err.value)
    with pytest.raises(ValueError, match="shown=True/False"):
        check(exercise_0_97, why="one entry of random tensors")
    with pytest.raises(ValueError, match="a name like"):
        check("demo without a number", shown=True, why="one entry of random tensors")
    with pytest.raises(ValueError, match="say why"):
        check(exercise_0_97, shown=True, why=" ")


def test_check_close_says_nan_in_the_exercises_words(exercise_0_97):
    nan = ("your loss is NaN (an empty mask)", "divide each masked sum by its mask's sum.")
    with pytest.raises(ExerciseError) as err:
        check_close(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0]), name=exercise_0_97, nan=nan)
    assert "your loss is NaN (an empty mask)" in str(err.value) and "divide each masked sum" in str(err.value)
    with pytest.raises(ExerciseError, match="shape mismatch"):  # the shape is compared first
        check_close(torch.tensor([float("nan")]), torch.tensor([1.0, 2.0]), name=exercise_0_97, nan=nan)
    with pytest.raises(ExerciseError) as err:  # without NaN, the ordinary comparison
        check_close(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 2.0]), name=exercise_0_97, nan=nan)
    assert "NaN" not in str(err.value)
    check_close(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]), name=exercise_0_97, nan=nan)


# ------------------------------------------------------------------ shortcuts switched off (core.refused)
def test_refused_switches_a_library_call_off_everywhere_and_puts_it_back():
    import sys

    import torch.nn.functional as F

    from minimind_ref.checks import core

    namespace = {"torch": torch, "F": F}
    exec("from torch import softmax as imported_softmax\n"
         "def by_module(x): return torch.softmax(x, -1)\n"
         "def by_method(x): return x.softmax(-1)\n"
         "def by_functional(x): return F.softmax(x, -1)\n"
         "def by_name(x): return imported_softmax(x, -1)\n", namespace)
    shortcuts = [core.Shortcut("torch.softmax", (torch, "softmax"), (torch.Tensor, "softmax"), (F, "softmax"))]
    for fn in ["by_module", "by_method", "by_functional", "by_name"]:
        with pytest.raises(ExerciseError) as err:
            with core.refused("Exercise 0.5 softmax", namespace[fn], shortcuts, "build it from exponentials"):
                call(namespace[fn], torch.zeros(3), name="Exercise 0.5 softmax")
        text = str(err.value)
        assert text.startswith("[Exercise 0.5 softmax] Exercise 0.5 asks you to build this without torch.softmax"), text
        assert "hint: build it from exponentials" in text, text
    with pytest.raises(ExerciseError, match="without torch.softmax"):  # the library function itself, passed as fn
        with core.refused("Exercise 0.5 softmax", torch.softmax, shortcuts):
            torch.softmax(torch.zeros(2), -1)
    x = torch.zeros(2)
    assert torch.equal(torch.softmax(x, -1), x.softmax(-1)) and torch.equal(namespace["by_name"](x), F.softmax(x, -1))
    assert "softmax" not in vars(torch.Tensor), "a method set on the class only for the block is removed again"
    assert namespace["imported_softmax"] is torch.softmax
    assert sys.modules["torch"].softmax is torch.softmax


def test_refused_reaches_a_python_function_bound_under_any_name():
    from minimind_ref import config
    from minimind_ref.checks import core

    rules = {"8/3": config.default_intermediate_size}  # a name bound in a dict before the block, as WIDTH_RULES is
    shortcut = core.Shortcut("the width rule", (config, "default_intermediate_size"))
    with pytest.raises(ExerciseError, match="without the width rule"):
        with core.refused("Exercise 0.6 width", rules["8/3"], [shortcut]):
            pass
    with pytest.raises(ExerciseError, match="without the width rule"):
        with core.refused("Exercise 0.6 width", lambda h: rules["8/3"](h), [shortcut]):
            rules["8/3"](512)
    assert rules["8/3"](512) == 1408 and config.default_intermediate_size(512) == 1408


def test_refused_refuses_a_subclass_calling_the_refused_method():
    from minimind_ref import RMSNorm
    from minimind_ref.checks import core

    class Wrapped(RMSNorm):
        def forward(self, x):
            return super().forward(x)

    layer = Wrapped(4)
    with pytest.raises(ExerciseError, match="without minimind_ref.RMSNorm"):
        with core.refused("Exercise 0.7 norm", layer, [core.Shortcut("minimind_ref.RMSNorm", (RMSNorm, "forward"))]):
            layer(torch.ones(2, 4))
    assert torch.allclose(layer(torch.ones(2, 4)), torch.ones(2, 4), atol=1e-4)


def test_shortcut_needs_places():
    from minimind_ref.checks import core

    with pytest.raises(ValueError, match="give one or more"):
        core.Shortcut("nothing")


def test_a_named_mistake_gets_its_own_hint():
    expected = torch.zeros(3)
    with pytest.raises(ExerciseError) as err:
        check_close(torch.ones(3), expected, name="Exercise 0.8", hint="the general hint",
                    mistakes={"ones instead of zeros": torch.ones(3)},
                    mistake_hints={"ones instead of zeros": "the hint about ones"})
    assert "this looks like ones instead of zeros" in str(err.value) and "hint: the hint about ones" in str(err.value)
    with pytest.raises(ExerciseError) as err:
        check_close(torch.full((3,), 2.0), expected, name="Exercise 0.8", hint="the general hint",
                    mistakes={"ones instead of zeros": torch.ones(3)},
                    mistake_hints={"ones instead of zeros": "the hint about ones"})
    assert "hint: the general hint" in str(err.value)
