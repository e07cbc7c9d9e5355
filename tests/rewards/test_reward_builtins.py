import math
import threading

import pytest

from grpo.rewards import BUILTIN_REWARDS, RewardError, load_reward, score
from grpo.rewards.language import language_consistency, make_language_consistency, target_script, words
from grpo.rewards.math_answer import answers_match, final_answer, math_accuracy
from grpo.rewards.shaping import make_cosine_length, make_repetition_penalty, make_soft_overlong, repetition_penalty
from grpo.rewards.text import chat_completions, reasoning_text, tag_count, think_format

# ---------------------------------------------------------------- math_accuracy


@pytest.mark.parametrize("completion,expected", [
    (r"so \boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"\boxed{1} then \boxed{\{1,2\}}", r"\{1,2\}"),                 # the last one; escaped braces skipped
    (r"\boxed{a{b}c}", "a{b}c"),                                     # nested braces balanced
    (r"\boxed {7}", "7"),
    ("<answer> 42 </answer>", "42"),
    (r"<answer>x = \boxed{3}</answer>", "3"),                        # a \boxed inside the answer block wins
    (r"<think>\boxed{2}</think><answer>3</answer>", "3"),            # the answer block beats an earlier \boxed
    (r"<answer></answer> \boxed{5}", "5"),                           # empty block: fall back to \boxed
    (r"\boxed{12", None),                                            # unclosed
    (r"\boxed{}", None),
    ("<answer>3", None),                                             # unclosed tag
    ("the answer is 3", None),
    ("", None),
])
def test_final_answer(completion, expected):
    assert final_answer(completion) == expected


@pytest.mark.parametrize("completion,answer,solution,expected", [
    ("<answer>0.5</answer>", r"\frac{1}{2}", None, 1.0),
    (r"\boxed{1/2}", "0.5", None, 1.0),
    (r"\boxed{\dfrac12}", None, r"so the answer is $\boxed{0.5}$.", 1.0),   # solution column, worked solution
    (r"\boxed{1,000}", 1000, None, 1.0),                                    # numeric reference
    (r"\boxed{\{2,1\}}", r"\{1,2\}", None, 1.0),
    (r"\boxed{x=0.5}", "1/2", None, 1.0),
    ("<answer>3.0</answer>", "3", None, 1.0),
    ("<answer>0.6</answer>", "1/2", None, 0.0),
    ("no answer here: 1/2", "1/2", None, 0.0),                              # nothing extractable
    (r"\boxed{1/2", "1/2", None, 0.0),                                      # malformed \boxed
    ("<answer>}{</answer>", "1/2", None, 0.0),                              # garbage answer
    ("", "1", None, 0.0),
    ([{"role": "assistant", "content": r"\boxed{2}"}], "2", None, 1.0),     # conversational completion
    (r"\boxed{2}", None, None, None),                                       # no reference: does not apply
    (r"\boxed{2}", "  ", None, None),
    (r"\boxed{2}", "", "2", 1.0),                                           # empty answer -> solution
])
def test_math_accuracy(completion, answer, solution, expected):
    assert math_accuracy(["p"], [completion], answer=[answer], solution=[solution]) == [expected]


def test_math_accuracy_without_reference_columns():
    assert math_accuracy(["p", "q"], [r"\boxed{1}", "x"]) == [None, None]


def test_answers_match_falls_back_to_text_when_unparseable():
    assert answers_match("B", "B") and not answers_match("B", "C")


@pytest.mark.parametrize("error", [RuntimeError("boom"), "timeout"])
def test_math_verify_errors_and_timeouts_count_as_wrong(monkeypatch, error):
    import math_verify
    from math_verify.errors import TimeoutException

    def broken(*args, **kwargs):
        raise TimeoutException("Operation timed out!") if error == "timeout" else error

    monkeypatch.setattr(math_verify, "verify", broken)
    assert math_accuracy(["p"], [r"\boxed{1}"], answer=["1"]) == [0.0]
    monkeypatch.setattr(math_verify, "parse", broken)       # unparseable -> text comparison
    assert math_accuracy(["p", "p"], [r"\boxed{1}", r"\boxed{2}"], answer=["1", "1"]) == [1.0, 0.0]


def test_math_verify_timeout_only_in_the_main_thread(monkeypatch):
    import math_verify

    seen = []
    real = math_verify.parse
    monkeypatch.setattr(math_verify, "parse", lambda *a, **kw: seen.append(kw["parsing_timeout"]) or real(*a, **kw))
    math_accuracy(["p"], [r"\boxed{1}"], answer=["1"])
    worker = threading.Thread(target=math_accuracy, args=(["p"], [r"\boxed{1}"]), kwargs={"answer": ["1"]})
    worker.start()
    worker.join()
    assert seen == [5, 5, None, None]     # signal.alarm cannot be used outside the main thread

# ---------------------------------------------------------------- format rewards


@pytest.mark.parametrize("completion,fmt,tags", [
    ("<think>a</think><answer>b</answer>", 1.0, 1.0),
    (" <think>\na\n</think>\n\n<answer> b </answer>\n<|im_end|>", 1.0, 1.0),  # whitespace + trailing special token
    ("<think></think><answer>b</answer>", 0.0, 1.0),                        # empty reasoning
    ("<think>a</think><answer> </answer>", 0.0, 1.0),                       # blank answer
    ("<think>a</think>x<answer>b</answer>", 0.0, 1.0),                      # text between the blocks
    ("<think>a</think><answer>b</answer> trailing", 0.0, 1.0),
    ("<THINK>a</THINK><answer>b</answer>", 0.0, 0.5),                       # tags are case-sensitive
    ("a</think><answer>b</answer>", 0.0, 0.75),                             # <think> from the chat template
    ("<think>a<think></think><answer>b</answer>", 0.0, 0.75),               # repeated tag loses its credit
    ("<think>a<answer></think><answer>b</answer>", 0.0, 0.75),
    ("<think>a</think><answer>b</answer><answer>c</answer>", 0.0, 0.5),
    ("<answer>b</answer><think>a</think>", 0.0, 0.0),                       # all out of order
    ("</think><think>a<answer>b</answer>", 0.0, 0.5),                       # think tags swapped
    ("<think>a</think>", 0.0, 0.5),
    ("plain text", 0.0, 0.0),
    ("", 0.0, 0.0),
])
def test_think_format_and_tag_count(completion, fmt, tags):
    assert think_format(["p"], [completion]) == [fmt]
    assert tag_count(["p"], [completion]) == [tags]


@pytest.mark.parametrize("completion,reasoning", [
    ("<think>abc</think><answer>1</answer>", "abc"),
    ("pre <think>abc", "abc"),
    ("abc</think><answer>1</answer>", "abc"),
    ("just text", "just text"),
])
def test_reasoning_text(completion, reasoning):
    assert reasoning_text(completion) == reasoning

# ---------------------------------------------------------------- length and repetition shaping


@pytest.mark.parametrize("length,correct,expected", [
    (0, True, 1.0), (50, True, 0.75), (100, True, 0.5), (150, True, 0.5),       # L clipped to L_max
    (0, False, -0.5), (50, False, -0.25), (100, False, 0.0), (25, True, 0.5 + 0.25 * (1 + math.cos(math.pi / 4))),
])
def test_cosine_length_from_token_ids(length, correct, expected):
    fn = make_cosine_length(max_len=100)
    completion = r"\boxed{2}" if correct else r"\boxed{3}"
    out = fn(["p"], [completion], answer=["2"], completion_ids=[[7] * length])
    assert out == [pytest.approx(expected)]


def test_cosine_length_words_missing_answer_and_no_reference():
    fn = make_cosine_length(max_len=4, correct_at_0=2.0, correct_at_max=1.0)
    # 4 words = L_max: correct -> 1.0; no extractable answer counts as wrong, 2 words -> -0.25; no reference -> None
    out = fn(["p"] * 3, [r"a b c \boxed{2}", "no answer", r"\boxed{2}"], answer=["2", "2", None])
    assert out == [pytest.approx(1.0), pytest.approx(-0.25), None]


@pytest.mark.parametrize("completion,ngram,penalty,expected", [
    ("a b c a b c", 3, -1.0, -0.25),              # 4 trigrams, 3 distinct
    ("A b C a B c", 3, -1.0, -0.25),              # lower-cased
    ("a a a a a", 1, -1.0, -0.8),                 # 5 unigrams, 1 distinct
    ("a a a a a", 2, -0.5, -0.375),               # 4 bigrams, 1 distinct
    ("the quick brown fox jumps", 3, -1.0, 0.0),  # no repetition
    ("a b", 3, -1.0, 0.0),                        # shorter than n
    ("", 3, -1.0, 0.0),
])
def test_repetition_penalty(completion, ngram, penalty, expected):
    fn = make_repetition_penalty(ngram_size=ngram, max_penalty=penalty)
    assert fn(["p"], [completion]) == [pytest.approx(expected)]


def test_repetition_penalty_default_is_trigrams():
    assert repetition_penalty(["p"], ["x y z x y z"]) == [pytest.approx(-0.25)]


@pytest.mark.parametrize("length,expected", [(0, 0.0), (6, 0.0), (7, -0.25), (8, -0.5), (10, -1.0), (12, -1.0)])
def test_soft_overlong_from_token_ids(length, expected):
    fn = make_soft_overlong(max_len=10, cache=4)
    assert fn(["p"], ["text"], completion_ids=[list(range(length))]) == [pytest.approx(expected)]


def test_soft_overlong_counts_words_without_token_ids():
    assert make_soft_overlong(max_len=4, cache=2, factor=0.5)(["p"], ["a b c"]) == [pytest.approx(-0.25)]


@pytest.mark.parametrize("factory,kwargs,message", [
    (make_cosine_length, {"max_len": 0}, "max_len must be >= 1"),
    (make_repetition_penalty, {"ngram_size": 0}, "ngram_size must be >= 1"),
    (make_repetition_penalty, {"max_penalty": 0.5}, "max_penalty must be <= 0"),
    (make_soft_overlong, {"max_len": 10, "cache": 11}, "need 0 <= cache <= max_len"),
    (make_language_consistency, {"language": "xx"}, "unknown language 'xx'"),
])
def test_factories_reject_bad_parameters(factory, kwargs, message):
    with pytest.raises(RewardError, match=message):
        factory(**kwargs)

# ---------------------------------------------------------------- language consistency


@pytest.mark.parametrize("completion,language,expected", [
    ("<think>I think the answer is two</think><answer>2</answer>", None, 1.0),
    ("<think>Hello world 你好</think><answer>1</answer>", None, 0.5),      # 2 Latin words + 2 Han characters
    ("<think>Hello world 你好</think>", "zh", 0.5),
    ("这是中文推理", "zh-CN", 1.0),                                         # every Han character is a word
    ("Это тест ok", "ru", 2 / 3),
    ("Это тест ok", "Cyrillic", 2 / 3),                                   # a script name works too
    ("café naïve Ærø", "fr", 1.0),                                        # Latin-1 letters are Latin
    ("x² = 4, so x = 2 or -2.", "en", 1.0),                               # words without letters are ignored
    ("123 + 4 = 127", "en", 0.0),                                         # no word with letters
    ("<think></think><answer>The answer</answer>", "en", 0.0),            # empty reasoning
    ("", "en", 0.0),
    ("Привет-hello", "ru", 0.0),                                          # mixed-script word: not target
    ("Γειά σου κόσμε", "el", 1.0),
])
def test_language_consistency(completion, language, expected):
    assert language_consistency(["p"], [completion], language=[language]) == [pytest.approx(expected)]


def test_language_consistency_default_and_errors():
    assert language_consistency(["p"], ["only English words"]) == [1.0]           # no column: English
    assert make_language_consistency("zh")(["p"], ["中文 and"]) == [pytest.approx(2 / 3)]
    with pytest.raises(ValueError, match="unknown language 'klingon'"):
        language_consistency(["p"], ["x"], language=["klingon"])


def test_scripts_and_words():
    assert [target_script(x) for x in ("en", "zh-TW", "ru_RU", "Han", None)] == ["latin", "han", "cyrillic", "han",
                                                                                "latin"]
    assert words("a 中文 b,c") == ["a", "中", "文", "b,c"]

# ---------------------------------------------------------------- registry and parameters


def test_every_builtin_is_documented_and_loadable():
    for name, fn in BUILTIN_REWARDS.items():
        assert fn.__doc__ and fn.__doc__.strip(), name
        assert load_reward(name) == (name, fn)


@pytest.mark.parametrize("spec,completion,columns,expected", [
    ("cosine_length:max_len=10", r"\boxed{1}", {"answer": ["1"], "completion_ids": [[0] * 10]}, 0.5),
    ("cosine_length:max_len=10,correct_at_max=0.25", r"\boxed{1}", {"answer": ["1"], "completion_ids": [[0] * 10]},
     0.25),
    ("repetition_penalty: ngram_size = 1 , max_penalty=-2", "a a", {}, -1.0),
    ("soft_overlong:max_len=4,cache=2", "a b c d", {}, -1.0),
    ("language_consistency:language=zh", "中文", {}, 1.0),
])
def test_parameterised_builtins(spec, completion, columns, expected):
    name, fn = load_reward(spec)
    assert name == spec
    assert fn(["p"], [completion], **columns) == [pytest.approx(expected)]


@pytest.mark.parametrize("spec,message", [
    ("think_format:strict=1", "reward 'think_format' takes no parameters"),
    ("cosine_length:maxlen=5", "reward 'cosine_length' has no parameter 'maxlen' \\(parameters: max_len"),
    ("cosine_length:max_len", "parameter 'max_len' must be key=value"),
    ("cosine_length:max_len=abc", "parameter max_len must be a number, got 'abc'"),
    ("cosine_length:max_len=0", "max_len must be >= 1"),
    ("repetition_penalty:max_penalty=1", "max_penalty must be <= 0"),
])
def test_parameter_errors(spec, message):
    with pytest.raises(RewardError, match=message):
        load_reward(spec)

# ---------------------------------------------------------------- called by keyword, conversational completions

CHAT_PROMPT = [{"role": "user", "content": "What is 1 + 1?"}]
TEXTS = ["<think>two is two</think><answer>2</answer>", "```python\nprint(2)\n```"]
COLUMNS = {"answer": ["2", "2"], "tests": [[{"input": "", "output": "2"}]] * 2, "completion_ids": [[7] * 3] * 2}
#: Every built-in's values on TEXTS with COLUMNS.
KEYWORD_CASES = [
    ("accuracy", [1.0, 0.0]), ("format", [1.0, 0.0]), ("math_accuracy", [1.0, 0.0]), ("think_format", [1.0, 0.0]),
    ("exact_match", [1.0, 0.0]),                         # "2" in the answer block; no block
    ("tag_count", [1.0, 0.0]),
    # L = 3 of 1000 tokens: correct 0.5 + 0.25 (1 + cos(0.003 pi)), wrong -0.25 (1 + cos(0.003 pi))
    ("cosine_length", [0.5 + 0.25 * (1 + math.cos(0.003 * math.pi)), -0.25 * (1 + math.cos(0.003 * math.pi))]),
    ("repetition_penalty", [0.0, 0.0]),                  # three words each: one distinct 3-gram
    ("soft_overlong", [0.0, 0.0]),                       # 3 tokens, far below 1000 - 200
    ("language_consistency", [1.0, 1.0]),                # "two is two"; "python", "print" (Latin)
    ("code_execution", [0.0, 1.0]),                      # no code; prints 2
]


def test_every_builtin_has_a_keyword_case():
    assert {name for name, _ in KEYWORD_CASES} == set(BUILTIN_REWARDS)


@pytest.mark.parametrize("name,expected", KEYWORD_CASES)
def test_builtins_score_text_and_conversational_completions_alike(name, expected):
    fns = [load_reward(name)]
    chat_prompts = [CHAT_PROMPT] * 2
    as_chat = score(fns, None, chat_prompts, chat_completions(chat_prompts, TEXTS), COLUMNS)   # called by keyword
    as_text = score(fns, None, ["What is 1 + 1?"] * 2, TEXTS, COLUMNS)
    assert as_chat.total.tolist() == pytest.approx(expected) and as_text.total.tolist() == pytest.approx(expected)


def test_chat_completions_wrap_texts_of_chat_prompts_only():
    reply = [{"role": "assistant", "content": "c"}]
    assert chat_completions([CHAT_PROMPT, "plain", CHAT_PROMPT], ["a", "b", reply]) == [
        [{"role": "assistant", "content": "a"}], "b", reply]


def test_one_parser_serves_format_think_format_and_the_task():
    """`format` (the embedded task's rule: empty reasoning allowed) and `think_format` (non-blank parts)
    read the same parse (grpo.rewards.text.think_answer_parts); they differ only in that rule."""
    from grpo.data.tasks import arithmetic
    from grpo.rewards.text import think_answer_parts

    cases = ["<think>a</think>\n<answer>b</answer><|im_end|>", "<think></think><answer>b</answer>",
             "<think>a</think><answer>b</answer> x", "<think><think></think><answer>b</answer>"]
    assert [think_answer_parts(c) for c in cases] == [("a", "b"), ("", "b"), None, None]
    fmt = BUILTIN_REWARDS["format"]
    assert fmt(["p"] * 4, cases) == [1.0, 1.0, 0.0, 0.0] == [float(arithmetic.format_ok(c)) for c in cases]
    assert think_format(["p"] * 4, cases) == [1.0, 0.0, 0.0, 0.0]
