"""grpo/training/evaluate.py: held-out decoding stops where training's does (every EOS id) and reads the same text."""

from __future__ import annotations

from grpo.modeling.models import build_model, build_tokenizer
from grpo.training.evaluate import PassAtK, TextMetrics, evaluate, generate_texts

ROWS = [{"prompt": f"{a}+{a}="} for a in range(3)]


def test_evaluation_stops_at_the_generation_config_eos_ids():
    """Greedy, 8 tokens: with the model's generation_config listing every id of the vocabulary as an EOS, every
    completion is one token long (the EOS kept in the length) and reads as that token's text, special or not
    ('' for a special one, as TRL's skip_special_tokens=True)."""
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    free = generate_texts(model, tok, ROWS, max_new_tokens=8)
    assert [len(t) for t in free] == [8, 8, 8]                          # the tokenizer's eos alone never came
    model.generation_config.eos_token_id = list(range(len(tok)))
    short = generate_texts(model, tok, ROWS, max_new_tokens=8)
    assert short == [t[:1] for t in free]                               # greedy: the same first token, then the end
    result = evaluate(model, tok, ROWS, [("zero", lambda completions, **kw: [0.0] * len(completions))],
                      max_new_tokens=8)
    assert result == {"zero": 0.0, "completion_length": 1.0}


def test_one_entry_point_with_a_summary_as_input():
    """The same greedy completions summarised three ways by evaluate(): reward means, pass@k with one record per
    row, a function of the texts. Every completion is 8 tokens (no EOS in reach, as above); the reward is 1 for
    row 1 only: means 1/3, pass@1 1/3, and the record of row 1 is the correct one."""
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    texts = generate_texts(model, tok, ROWS, max_new_tokens=8)
    row_one = ("one", lambda completions, prompts, **kw: [float(p == "1+1=") for p in prompts])
    means = evaluate(model, tok, ROWS, [row_one], max_new_tokens=8, batch_size=2)
    assert means == {"one": 1 / 3, "completion_length": 8.0}
    summary, records = evaluate(model, tok, ROWS, [row_one], max_new_tokens=8, summary=PassAtK(1, [1]))
    assert summary == {"problems": 3, "samples_per_problem": 1, "pass@1": 1 / 3, "reward/one": 1 / 3,
                       "completion_length": 8.0}
    assert [r["correct"] for r in records] == [0, 1, 0] and [r["samples"][0]["completion"] for r in records] == texts
    seen = evaluate(model, tok, ROWS, [], max_new_tokens=8, batch_size=2,
                    summary=TextMetrics(lambda t, rows: {"texts": t, "prompts": [r["prompt"] for r in rows]}))
    assert seen == {"texts": texts, "prompts": ["0+0=", "1+1=", "2+2="]}
