"""The wiring of the reward and advantage variants (grpo/training/variants.py) on the embedded
micro model: guided error correction, GRPO-LEAD's reward and weights, entropy-shaped advantages."""

import json

import pytest
import torch

from grpo.algorithms.entropy_advantages import edge_advantages
from grpo.algorithms.lead import lead_correctness_reward, lead_difficulty_weights
from grpo.api.trainer import train
from grpo.config import ConfigError, build_config
from grpo.modeling.logprobs import fixed_logprobs
from grpo.modeling.models import build_model, build_tokenizer
from grpo.training.experience import ExperienceInputs, draw_groups, lengths_of
from grpo.training.variants import advantage_variants

CPU = torch.device("cpu")


def exact(prompts, completions, solution, **kw):
    return [float(c == s) for c, s in zip(completions, solution)]


def digits(prompts, completions, **kw):
    return [float(sum(ch.isdigit() for ch in c) % 2) for c in completions]


def config(**over):
    flat = {"rollout.num_generations": 3, "rollout.max_new_tokens": 5, "train.seed": 0, "log.progress_bar": False,
            **over}
    return build_config(overrides=flat)


def test_guided_error_correction_injects_the_solution_into_all_wrong_groups():
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    rows = [{"prompt": "1+1=", "solution": "<answer>2</answer>"},     # longer than max_new_tokens = 5... cut
            {"prompt": "2+2=", "solution": "4"},
            {"prompt": "3+3=", "solution": ""}]                       # no solution: left alone
    cfg = config(**{"algorithm.guided_error_correction": True, "rollout.max_new_tokens": 8})
    inputs = ExperienceInputs(model, tok, [("exact", exact)])
    before = draw_groups(inputs, rows, [0, 1, 2], config(**{"rollout.max_new_tokens": 8}), CPU)
    after = draw_groups(inputs, rows, [0, 1, 2], cfg, CPU)
    assert before.total.tolist() == [0.0] * 9                          # the untrained model never writes them
    # groups 0 and 1: their last completion (rows 2 and 5) is the solution, scored again -> 1.0
    assert after.completions[2] == "<answer>2</answer>" and after.completions[5] == "4"
    assert after.completions[:2] == before.completions[:2] and after.completions[6:] == before.completions[6:]
    assert after.total.tolist() == [0, 0, 1, 0, 0, 1, 0, 0, 0]
    assert after.metrics["advantages/gec_injected"] == 2.0 and "advantages/gec_injected" not in before.metrics
    ids = after.gen.completion_ids[5][after.gen.completion_mask[5] > 0].tolist()
    assert ids == tok("4", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert not bool(after.gen.truncated[2]) and int(after.gen.completion_mask[2].sum()) == 4   # 3 tokens + EOS
    # the injected rows carry the policy's own log-probs as sampling log-probs
    g = after.gen
    input_ids = torch.cat([g.prompt_ids, g.completion_ids], 1)[[2, 5]]
    attn = torch.cat([g.prompt_mask, g.completion_mask], 1)[[2, 5]]
    own = fixed_logprobs(model, input_ids, attn, g.completion_ids.shape[1], 1.0) * g.completion_mask[[2, 5]]
    assert torch.allclose(g.sampling_logprobs[[2, 5]], own.float(), atol=1e-5)


def test_lead_reward_in_draw_groups_is_the_pure_function():
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    rows = [{"prompt": f"{i}+{i}="} for i in range(4)]
    inputs = ExperienceInputs(model, tok, [("digits", digits)])
    plain = draw_groups(inputs, rows, [0, 1, 2, 3], config(), CPU)
    lead = draw_groups(inputs, rows, [0, 1, 2, 3],
                       config(**{"algorithm.length_reward_alpha": 0.05, "algorithm.wrong_answer_penalty": 1.0}), CPU)
    expected = lead_correctness_reward(plain.per_function[:, 0], lengths_of(plain.gen), 3, 0.05, 1.0)
    assert torch.allclose(lead.per_function[:, 0], expected) and torch.allclose(lead.total, expected)
    assert bool((plain.total > 0).any()) and bool((lead.total == -1).any())
    # the accuracy before the reshaping stays visible
    assert lead.metrics["reward/digits/raw_mean"] == pytest.approx(float(plain.per_function[:, 0].mean()))
    assert "reward/digits/raw_mean" not in plain.metrics


def test_advantage_variants_apply_edge_then_difficulty_weights():
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    rows = [{"prompt": f"{i}+1="} for i in range(4)]
    cfg = config(**{"algorithm.entropy_advantage": "edge", "algorithm.difficulty_weighting": "lead"})
    groups = draw_groups(ExperienceInputs(model, tok, [("digits", digits)]), rows, [0, 1, 2, 3], cfg, CPU)
    g = groups.gen
    input_ids, attn = torch.cat([g.prompt_ids, g.completion_ids], 1), torch.cat([g.prompt_mask, g.completion_mask], 1)
    mask = g.completion_mask.float()
    from grpo.algorithms.advantages import grpo_advantages
    values = grpo_advantages(groups.total, 3).values
    metrics = {}
    got = advantage_variants(model, groups, ["digits"], groups.total, values, input_ids, attn, mask, cfg, 0, metrics)
    entropy = fixed_logprobs(model, input_ids, attn, mask.shape[1], 1.0, with_entropy=True)[1]
    correct = groups.per_function[:, 0] > 0
    expected = lead_difficulty_weights(edge_advantages(None, values, None, entropy, mask, 3, 0.0, None).float(),
                                       correct, torch.ones_like(correct), 3)
    assert torch.allclose(got, expected, atol=1e-6) and "advantages/entropy_mean" in metrics


@pytest.mark.parametrize("preset", ["edge_grpo", "gtpo", "grpo_s", "grpo_lead", "tic_grpo"])
def test_variant_presets_train_with_the_embedded_task(tmp_path, preset):
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    flat = {"algorithm.preset": preset, "train.output_dir": str(tmp_path), "train.max_steps": 2,
            "train.prompts_per_step": 2, "rollout.num_generations": 4, "rollout.max_new_tokens": 6,
            "data.num_train_prompts": 20, "log.progress_bar": False, "train.save_final": False,
            "algorithm.num_iterations": 2}                  # mu = 2: TIC-GRPO's ratio differs from 1
    train(build_config(overrides=flat), model, tok)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["optim/skipped_steps"] == 0 for r in records)
    if preset in ("edge_grpo", "gtpo", "grpo_s"):
        assert records[0]["advantages/entropy_mean"] > 0


def test_bad_variant_keys_are_one_line_errors():
    with pytest.raises(ConfigError, match="algorithm.entropy_advantage"):
        build_config(overrides={"algorithm.entropy_advantage": "nope"})
    with pytest.raises(ConfigError, match="algorithm.difficulty_weighting"):
        build_config(overrides={"algorithm.difficulty_weighting": "nope"})
    with pytest.raises(ConfigError, match="algorithm.entropy_advantage.reward_weight must be in"):
        build_config(overrides={"algorithm.entropy_advantage": {"name": "gtpo", "reward_weight": 1.5}})
