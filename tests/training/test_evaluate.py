"""grpo/training/evaluate.py: held-out decoding stops where training's does (every EOS id) and reads the same text."""

from __future__ import annotations

from grpo.modeling.models import build_model, build_tokenizer
from grpo.training.evaluate import evaluate, generate_texts

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
