"""The experience pipeline: sampling filters, KL in reward, process supervision, loss masks."""

import json

import pytest
import torch

import grpo.training.experience as experience
from grpo.cli.main import main
from grpo.config import build_config
from grpo.data.prompts import PromptStream, load_prompts
from grpo.training.experience import (ExperienceInputs, Groups, collect_groups, draw_groups, group_rows,
                                      make_experience)
from grpo.algorithms.loss import kl_k1
from grpo.modeling.models import build_model, build_tokenizer
from grpo.modeling.reference import FrozenCopy
from grpo.rewards import load_reward
from grpo.rollout import Generation
from tests.run_helpers import cli_argv

BASE = {"train.prompts_per_step": 2, "rollout.num_generations": 4, "rollout.max_new_tokens": 6,
        "data.num_train_prompts": 20, "log.progress_bar": False}


def setup(tmp_path, reward_src="def r(prompts, completions, **kw):\n    return [float(len(c)) for c in completions]\n",
          **over):
    (tmp_path / "r.py").write_text(reward_src)
    cfg = build_config(overrides={**BASE, "reward.functions": [f"{tmp_path / 'r.py'}:r"], **over})
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    stream = PromptStream(load_prompts(cfg.data, 0, tok).rows, 0)
    rewards = [load_reward(s) for s in cfg.reward.functions]
    return cfg, tok, model, stream, rewards


def test_group_rows():
    assert group_rows([2, 0], 2).tolist() == [4, 5, 0, 1]


def fake_groups(totals: list[float]) -> Groups:
    n = len(totals)
    gen = Generation(torch.ones(n, 2, dtype=torch.long), torch.ones(n, 2, dtype=torch.long),
                     torch.full((n, 3), 5), torch.ones(n, 3, dtype=torch.long), torch.zeros(n, 3),
                     torch.zeros(n, dtype=torch.bool))
    t = torch.tensor(totals)
    return Groups(gen, ["p"] * n, {"answer": list(range(n))}, ["c"] * n, t.unsqueeze(1), t, 0.5)


def test_dynamic_sampling_replaces_tied_groups_and_counts_draws(tmp_path, monkeypatch):
    cfg, tok, model, stream, rewards = setup(tmp_path, **{"algorithm.dynamic_sampling": True,
                                                           "rollout.num_generations": 2,
                                                           "train.prompts_per_step": 3})
    draws = iter([fake_groups([1, 1, 0, 1, 2, 2]),   # groups: tied, informative, tied
                  fake_groups([3, 3, 5, 6]),         # 2 more asked: tied, informative
                  fake_groups([7, 8])])              # 1 more asked: informative
    asked = []
    monkeypatch.setattr(experience, "draw_groups",
                        lambda inputs, rows, *a: asked.append(len(rows)) or next(draws))
    groups, metrics = collect_groups(ExperienceInputs(model, tok, rewards), stream, cfg, "cpu")
    assert asked == [3, 2, 1]
    assert groups.total.tolist() == [0, 1, 5, 6, 7, 8]          # only informative groups, in draw order
    assert metrics == {"sampling/groups_drawn": 6.0, "sampling/extra_rounds": 2.0,
                       "sampling/informative_groups": 3.0}
    assert groups.sample_s == 1.5                                 # three draws of 0.5 s each


def test_dynamic_sampling_stops_at_the_cap_and_tops_up_with_tied_groups(tmp_path, monkeypatch):
    cfg, tok, model, stream, rewards = setup(tmp_path, **{"algorithm.dynamic_sampling": True,
                                                           "algorithm.max_sampling_tries": 1,
                                                           "rollout.num_generations": 2})
    draws = iter([fake_groups([1, 1, 0, 1]), fake_groups([4, 4])])
    monkeypatch.setattr(experience, "draw_groups", lambda inputs, rows, *a: next(draws))
    groups, metrics = collect_groups(ExperienceInputs(model, tok, rewards), stream, cfg, "cpu")
    assert groups.total.tolist() == [0, 1, 1, 1]                  # informative first, then a tied group
    assert metrics["sampling/informative_groups"] == 1.0 and metrics["sampling/extra_rounds"] == 1.0


def test_gfpo_keeps_the_shortest_of_k_samples(tmp_path):
    # the same keys (seed, prompt index) and k = 8 samples: GFPO must keep the 4 shortest of each group of 8
    cfg_all, tok, model, stream, rewards = setup(tmp_path, **{"rollout.num_generations": 8})
    rows = stream.next(2)
    all8 = draw_groups(ExperienceInputs(model, tok, rewards), rows, [0, 1], cfg_all, "cpu")
    cfg_gfpo = build_config(overrides={**BASE, "reward.functions": cfg_all.reward.functions,
                                       "rollout.num_generations": 4, "algorithm.gfpo_sample_size": 8,
                                       "algorithm.gfpo_metric": "length"})
    kept = draw_groups(ExperienceInputs(model, tok, rewards), rows, [0, 1], cfg_gfpo, "cpu")
    lengths = all8.gen.completion_mask.sum(1).view(2, 8)
    kept_lengths = kept.gen.completion_mask.sum(1).view(2, 4)
    for g in range(2):
        assert sorted(kept_lengths[g].tolist()) == sorted(lengths[g].tolist())[:4]
    assert len(kept.completions) == 8 and kept.total.shape == (8,)
    assert kept.prompts[:4] == [rows[0]["prompt"]] * 4


def test_soft_overlong_penalty_is_added_to_the_reward(tmp_path):
    cfg, tok, model, stream, rewards = setup(tmp_path, **{"algorithm.overlong_cache_fraction": 0.5})
    groups = draw_groups(ExperienceInputs(model, tok, rewards), stream.next(2), [0, 1], cfg, "cpu")
    L = groups.gen.completion_mask.sum(1).float()               # cache = 3 of max 6 tokens
    penalty = torch.where(L <= 3, torch.zeros_like(L), (3 - L) / 3)
    assert torch.allclose(groups.total, groups.per_function[:, 0] + penalty)


def test_overlong_filter_masks_truncated_completions(tmp_path):
    cfg, tok, model, stream, rewards = setup(tmp_path, **{"algorithm.overlong_filter": True, "algorithm.beta": 0.0})
    exp = make_experience(ExperienceInputs(model, tok, rewards, []), stream, cfg, "cpu")
    truncated = exp.groups.gen.truncated
    assert truncated.any()                                       # an untrained model rarely stops in 6 tokens
    assert (exp.batch.completion_mask[truncated] == 0).all()
    assert torch.equal(exp.batch.completion_mask[~truncated], exp.groups.gen.completion_mask[~truncated].float())
    assert exp.metrics["completion/overlong_filtered"] == float(truncated.sum())


def test_kl_in_reward_moves_the_penalty_out_of_the_loss(tmp_path):
    cfg, tok, model, stream, rewards = setup(tmp_path, **{"algorithm.kl_in": "reward", "algorithm.beta": 0.5,
                                                           "algorithm.kl_estimator": "k1"})
    reference = FrozenCopy(build_model(tok, "micro", seed=1))    # a different reference: KL != 0
    exp = make_experience(ExperienceInputs(model, tok, rewards, [], reference), stream, cfg, "cpu")
    b = exp.batch
    old = experience.fixed_logprobs(model, b.input_ids, b.attention_mask, b.completion_length, 1.0)
    ref = reference.logprobs(b.input_ids, b.attention_mask, b.completion_length, 1.0)
    expected = exp.groups.total - 0.5 * (kl_k1(old, ref) * b.completion_mask).sum(1)
    torch.testing.assert_close(exp.scored.total, expected)
    assert b.ref_logprobs is None and b.old_logprobs is None      # nothing of the KL is left for the loss


def test_process_supervision_gives_token_advantages(tmp_path):
    src = ("def r(prompts, completions, **kw):\n    return [float(len(c)) for c in completions]\n"
           "def steps(prompts, completions, steps, **kw):\n    return [[float(len(s)) for s in st] for st in steps]\n")
    cfg, tok, model, stream, rewards = setup(tmp_path, src, **{"algorithm.beta": 0.0,
                                                               "reward.step_delimiter": " "})
    step_fns = [load_reward(f"{tmp_path / 'r.py'}:steps")]
    cfg = build_config(overrides={**BASE, "reward.functions": [], "reward.process_functions": [f"{tmp_path / 'r.py'}:steps"],
                                  "algorithm.beta": 0.0, "reward.step_delimiter": " "})
    exp = make_experience(ExperienceInputs(model, tok, [], step_fns), stream, cfg, "cpu")
    adv = exp.batch.advantages
    assert adv.shape == exp.batch.completion_mask.shape                          # [N, T]
    assert (adv[exp.batch.completion_mask == 0] == 0).all()
    assert adv.abs().sum() > 0


def test_top_entropy_rho_keeps_a_fraction_of_tokens(tmp_path):
    cfg, tok, model, stream, rewards = setup(tmp_path, **{"algorithm.top_entropy_rho": 0.25, "algorithm.beta": 0.0})
    exp = make_experience(ExperienceInputs(model, tok, rewards, []), stream, cfg, "cpu")
    active = exp.groups.gen.completion_mask.sum()
    kept = exp.batch.completion_mask.sum()
    assert kept == torch.ceil(0.25 * active.float())
    assert ((exp.batch.completion_mask == 1) <= (exp.groups.gen.completion_mask == 1)).all()


# ---------------------------------------------------------------- rewards called by keyword, as TRL calls them

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def write_dataset(path, chat: bool):
    """Six rows with a ``solution`` column; prompts as text or as one user message."""
    rows = [{"prompt": [{"role": "user", "content": f"{a}+{a}="}] if chat else f"{a}+{a}=", "solution": str(2 * a)}
            for a in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_draw_groups_calls_rewards_by_keyword_with_messages_for_chat_prompts(tmp_path):
    cfg = build_config(overrides={**BASE, "data.dataset": str(write_dataset(tmp_path / "chat.jsonl", chat=True)),
                                  "reward.functions": ["format"], "rollout.num_generations": 3})
    tok = build_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    model = build_model(tok, "micro", seed=0)
    rows = load_prompts(cfg.data, 0, tok).rows[:2]
    seen = {}

    def accuracy_reward(completions, solution, **kwargs):         # TRL's signature
        seen.update(kwargs, completions=completions, solution=solution)
        return [float(s in completion[0]["content"]) for completion, s in zip(completions, solution)]

    groups = draw_groups(ExperienceInputs(model, tok, [("acc", accuracy_reward)]), rows, [0, 1], cfg, "cpu")
    assert seen["completions"] == [[{"role": "assistant", "content": text}] for text in groups.completions]
    assert all(isinstance(text, str) for text in groups.completions)             # the texts stay texts
    assert seen["solution"] == [rows[0]["solution"]] * 3 + [rows[1]["solution"]] * 3
    assert seen["prompts"] == groups.prompts == [rows[0]["prompt"]] * 3 + [rows[1]["prompt"]] * 3
    mask, ids = groups.gen.completion_mask, groups.gen.completion_ids
    assert seen["completion_ids"] == [ids[i][mask[i] == 1].tolist() for i in range(6)]
    assert groups.per_function[:, 0].tolist() == [float(s in t) for t, s in zip(groups.completions, seen["solution"])]


TRL_REWARDS = '''
import asyncio

def accuracy_reward(completions, solution, **kwargs):
    return [float(sum(ch.isdigit() for ch in c)) + float(s in c) for c, s in zip(completions, solution)]

def chat_digits(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in completion[0]["content"])) for completion in completions]

def token_count(completion_ids, **kwargs):
    return [float(len(ids)) for ids in completion_ids]

async def is_chat(prompts, **kwargs):
    await asyncio.sleep(0)
    return [float(isinstance(p, list)) for p in prompts]
'''


@pytest.mark.parametrize("chat,functions", [(False, ["accuracy_reward", "token_count", "is_chat"]),
                                            (True, ["chat_digits", "token_count", "is_chat"])])
def test_grpo_train_with_trl_reward_functions(tmp_path, chat, functions):
    tok = build_tokenizer()
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    model_dir = tmp_path / "model"
    build_model(tok, "micro", seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    (tmp_path / "trl_rewards.py").write_text(TRL_REWARDS)
    flat = {"model.path": str(model_dir), "data.dataset": str(write_dataset(tmp_path / "data.jsonl", chat)),
            "reward.functions": [f"{tmp_path / 'trl_rewards.py'}:{name}" for name in functions],
            "train.output_dir": str(tmp_path / "out"), "train.max_steps": 1, "train.prompts_per_step": 2,
            "cpu.num_threads": 1, "train.save_final": False, "rollout.num_generations": 3,
            "rollout.max_new_tokens": 4, "log.progress_bar": False}
    assert main(cli_argv(flat)) == 0
    record = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    assert record["reward/is_chat/mean"] == float(chat)
    assert record["reward/token_count/mean"] == record["completion/length_mean"]   # completion_ids: EOS included
    assert record[f"reward/{functions[0]}/none_frac"] == 0.0


def test_draw_groups_samples_in_rollout_precision(tmp_path):
    """rollout.precision bf16 under train.precision fp32: the step's completions and sampler log-probs are
    those of a bf16-autocast rollout with the same keys; auto keeps the float32 rollout."""
    from grpo.data.prompts import tokenize_prompts
    from grpo.rollout import sample
    from grpo.rollout.params import Prompts, SamplingParams

    cfg, tok, model, stream, rewards = setup(tmp_path, **{"rollout.precision": "bf16"})
    rows = stream.next(2)
    got = draw_groups(ExperienceInputs(model, tok, rewards), rows, [5, 6], cfg, "cpu").gen
    prompts = tokenize_prompts(tok, rows, "cpu")
    request = Prompts(prompts.prompt_ids, prompts.prompt_mask, torch.tensor([5, 6]))
    params = SamplingParams(n=4, max_tokens=6, stop_token_ids=(tok.eos_token_id,), seed=cfg.train.seed)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = sample(model, request, params, pad_token_id=tok.pad_token_id)
    fp32 = sample(model, request, params, pad_token_id=tok.pad_token_id)
    assert torch.equal(got.completion_ids, bf16.completion_ids)
    assert torch.equal(got.sampling_logprobs, bf16.sampling_logprobs)
    assert not torch.equal(got.sampling_logprobs, fp32.sampling_logprobs)
    cfg_auto = build_config(overrides={**BASE, "reward.functions": cfg.reward.functions})
    auto = draw_groups(ExperienceInputs(model, tok, rewards), rows, [5, 6], cfg_auto, "cpu").gen
    assert torch.equal(auto.sampling_logprobs, fp32.sampling_logprobs)


def test_a_dataset_column_named_completion_ids_is_an_error_not_replaced():
    from grpo.rewards import RewardError
    from grpo.training.experience import reward_columns

    with pytest.raises(RewardError, match="a column is named 'completion_ids'.*rename it"):
        reward_columns({"completion_ids": [[1, 2]]}, None)


def test_decode_completions_skips_special_tokens_as_trl_does():
    """TRL decodes with skip_special_tokens=True (grpo_trainer.py ~2244): '42<|unk|>7<eos>' reads '427';
    the padding after the EOS is out of the mask; <think>/<answer> are not special tokens and stay."""
    from grpo.training.experience import decode_completions

    tok = build_tokenizer()
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    rows = [enc("42") + [tok.unk_token_id] + enc("7") + [tok.eos_token_id, tok.pad_token_id],
            enc("<think>1</think><answer>2</answer>")]                  # 6 tokens: the tags are single tokens
    masks = [[1, 1, 1, 1, 1, 0], [1] * 6]
    gen = Generation(torch.ones(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.long), torch.tensor(rows),
                     torch.tensor(masks), torch.zeros(2, 6), torch.zeros(2, dtype=torch.bool))
    assert decode_completions(tok, gen) == ["427", "<think>1</think><answer>2</answer>"]


@pytest.mark.parametrize("chat", [False, True])
def test_every_generation_config_eos_id_ends_a_completion(tmp_path, chat):
    """As TRL (grpo_trainer.py ~409-416): every id of generation_config.eos_token_id ends a completion. With every
    id listed, each completion is its first token (TRL's reproducer gives lengths [1, 1, ...]), kept in the
    mask and not truncated; rewards read its text with special tokens skipped, as a string or a message."""
    cfg = build_config(overrides={**BASE, "data.dataset": str(write_dataset(tmp_path / "d.jsonl", chat=chat)),
                                  "reward.functions": ["format"]})
    tok = build_tokenizer()
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    model = build_model(tok, "micro", seed=0)
    model.generation_config.eos_token_id = list(range(len(tok)))
    rows = load_prompts(cfg.data, 0, tok).rows[:2]
    seen = {}

    def reward(completions, completion_ids, **kwargs):
        seen.update(completions=completions, completion_ids=completion_ids)
        return [0.0] * len(completions)

    groups = draw_groups(ExperienceInputs(model, tok, [("r", reward)]), rows, [0, 1], cfg, "cpu")
    assert [len(ids) for ids in seen["completion_ids"]] == [1] * 8
    assert groups.gen.completion_mask.tolist() == [[1]] * 8 and not groups.gen.truncated.any()
    special = set(tok.all_special_ids)
    texts = ["" if ids[0] in special else tok.convert_ids_to_tokens(ids[0]) for ids in seen["completion_ids"]]
    assert groups.completions == texts
    assert seen["completions"] == ([[{"role": "assistant", "content": t}] for t in texts] if chat else texts)
