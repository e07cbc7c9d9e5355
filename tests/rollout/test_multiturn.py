"""grpo/rollout/multiturn.py: episodes with observation tokens fed through the same KV cache. The log-probs of
the model's tokens equal one forward over the concatenated episode; observation tokens are context only."""

from __future__ import annotations

import torch

from grpo.algorithms.loss import grpo_loss
from grpo.modeling.logprobs import fixed_logprobs
from grpo.rollout.multiturn import sample_episodes, written_mask
from grpo.rollout.params import Prompts, SamplingParams
from tests.conftest import tiny_qwen2
from tests.rollout.test_eos import Never

OBS = [5, 6, 7]


class EveryFour:
    """After every 4th model token of an episode, feed OBS; end (without EOS) after `turns` observations."""

    def __init__(self, turns: int = 2, eos_never: bool = True):
        self.count, self.turns, self.seen, self.finished = {}, turns, {}, {}

    def after_token(self, row, token):
        self.count[row] = self.count.get(row, 0) + 1
        if self.count[row] % 4:
            return [], False
        self.seen[row] = self.seen.get(row, 0) + 1
        return (list(OBS), False) if self.seen[row] <= self.turns else ([], True)

    def finish(self, row, ended_by_eos):
        self.finished[row] = ended_by_eos


def episodes(model, driver, lean=True, max_new_tokens=30):
    prompt_ids = torch.tensor([[0, 3, 4, 9], [11, 12, 13, 14]])
    prompt_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    params = SamplingParams(n=2, max_tokens=max_new_tokens, temperature=1.0, stop_token_ids=(1,), seed=3)
    return sample_episodes(model, Prompts(prompt_ids, prompt_mask), params, driver, pad_token_id=0, lean=lean)


def test_observations_are_fed_and_masked_out_of_the_actions():
    model = tiny_qwen2()
    gen = episodes(model, EveryFour(turns=2), max_new_tokens=40)
    for r in range(4):
        ids, act, mask = gen.completion_ids[r], gen.action_mask[r], gen.completion_mask[r]
        n = int(mask.sum())
        if int(act[:n].sum()) < 12:            # this episode ended with an EOS before its third turn
            continue
        # 4 model tokens, OBS, 4 model tokens, OBS, 4 model tokens: the driver ends it (no EOS: truncated)
        assert act[:n].tolist() == [1] * 4 + [0] * 3 + [1] * 4 + [0] * 3 + [1] * 4 and n == 18
        assert ids[4:7].tolist() == OBS and ids[11:14].tolist() == OBS
        assert bool(gen.truncated[r]) and (gen.sampling_logprobs[r][act == 0] == 0).all()


def test_episode_logprobs_equal_one_forward_over_the_concatenated_tokens():
    """The cached turn-by-turn path (model tokens sampled, observations fed) gives the log-probs a single
    forward of prompt + completion gives, at every model token; the lean decoder and HF's forward agree."""
    model = tiny_qwen2()
    for lean in (True, False):
        gen = episodes(model, EveryFour(turns=3), lean=lean)
        ids = torch.cat([gen.prompt_ids, gen.completion_ids], dim=1)
        att = torch.cat([gen.prompt_mask, gen.completion_mask], dim=1)
        logp = fixed_logprobs(model, ids, att, gen.completion_ids.shape[1], temperature=1.0)      # [N, T]
        act = gen.action_mask.bool()
        assert act.sum() > 20
        assert torch.allclose(logp[act], gen.sampling_logprobs[act], atol=1e-5)


def test_observation_tokens_shape_later_logprobs_but_carry_no_loss_or_kl():
    model = tiny_qwen2()
    gen = episodes(model, EveryFour(turns=1), max_new_tokens=12)
    ids = torch.cat([gen.prompt_ids, gen.completion_ids], dim=1)
    att = torch.cat([gen.prompt_mask, gen.completion_mask], dim=1)
    T = gen.completion_ids.shape[1]
    changed = ids.clone()
    changed[:, 4 + 4:4 + 7] = torch.tensor([20, 21, 22])                 # other observation tokens
    a, b = fixed_logprobs(model, ids, att, T), fixed_logprobs(model, changed, att, T)
    after = gen.action_mask.clone()
    after[:, :7] = 0
    assert (a[after.bool()] - b[after.bool()]).abs().max() > 1e-3      # later model tokens see the observation
    # loss and KL: zero weight on observation tokens (the mask is gen.loss_mask)
    logp = a.clone().requires_grad_(True)
    terms = grpo_loss(logp, logp.detach(), a.detach() - 0.3, torch.tensor([1.0, -1.0, 0.5, -0.5]),
                      gen.loss_mask.float(), epsilon=0.2, epsilon_high=None, beta=0.04, normalizer=4.0)
    terms.loss.backward()
    obs = (gen.completion_mask * (1 - gen.action_mask)).bool()
    assert obs.any() and (logp.grad[obs] == 0).all() and (logp.grad[gen.action_mask.bool()] != 0).any()


def test_the_token_cap_ends_every_episode():
    gen = episodes(tiny_qwen2(), EveryFour(turns=99), max_new_tokens=10)
    assert gen.completion_ids.shape[1] <= 10 and int(gen.completion_mask.sum(dim=1).max()) <= 10


def test_written_mask_by_hand():
    action = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    assert written_mask(action).tolist() == [[1, 1, 1, 1, 1, 0], [1, 0, 0, 0, 0, 0], [0] * 6]


def test_an_episode_of_one_turn_is_a_single_turn_sample():
    """Single-turn sampling and episodes run one decode loop: with a driver that never acts, an episode is the
    single-turn completion bit for bit (tokens, log-probs, masks, truncation), the repetition penalty included."""
    from grpo.rollout import sample

    model = tiny_qwen2()
    prompts = Prompts(torch.tensor([[0, 3, 4, 9], [11, 12, 13, 14]]), torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]),
                      torch.tensor([6, 2]))
    for params in (SamplingParams(n=3, max_tokens=12, temperature=1.0, seed=5),
                   SamplingParams(n=2, max_tokens=9, temperature=0.8, top_k=6, repetition_penalty=1.3, seed=1)):
        probe = sample(model, prompts, params.with_(stop_token_ids=(-1,)), pad_token_id=0).completion_ids
        params = params.with_(stop_token_ids=(1, int(probe[0, 3])))        # row 0 ends by its 4th token
        one = sample(model, prompts, params, pad_token_id=0)
        driver = Never()              # never feeds an observation nor ends an episode: one turn
        ep = sample_episodes(model, prompts, params, driver, pad_token_id=0)
        for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "sampling_logprobs",
                     "truncated"):
            assert torch.equal(getattr(one, name), getattr(ep, name)), name
        assert torch.equal(ep.action_mask, one.completion_mask)            # every written token is the model's
        assert driver.finished == {r: not bool(t) for r, t in enumerate(one.truncated)}
        assert one.truncated.any() and not one.truncated.all()             # rows end both ways
