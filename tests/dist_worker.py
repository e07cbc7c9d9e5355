"""One rank of tests/training/test_distributed.py, launched by `python -m torch.distributed.run --nproc-per-node 2`.

    dist_worker.py MODE WORK MODEL_DIR REWARD          (parts 1 and 2)
    dist_worker.py MODE WORK MODEL_DIR REWARD same     (part 3; a launch of its own: a process group
                                                        created again after train() destroyed one can
                                                        meet the old one's gloo addresses in the store)

1. policy_update through DDP / FSDP2 on this rank's rows of a fixed global batch, compared with the
   single-process policy_update on the whole batch (every rank computes that too): WORK/unit-<rank>.json.
2. A 2-step `train()` run (checkpoint every step) into WORK/run; this rank's final parameters go to
   WORK/rank<rank>.pt.
3. A 3-step run with plain SGD (:data:`SAME_AS_ONE`) into WORK/same: every completion this rank samples,
   by global prompt index (:func:`recording_draws`), goes to WORK/draws-<rank>.json and the final
   parameters to WORK/same-rank<rank>.pt; tests/training/test_distributed.py compares them with one process.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grpo.training import distributed  # noqa: E402
from grpo.config import build_config  # noqa: E402
from grpo.modeling.models import load_policy  # noqa: E402
from grpo.api.trainer import train  # noqa: E402
from grpo.types import TrainBatch  # noqa: E402
from grpo.training.update import UpdateSettings, build_optimizer, policy_update  # noqa: E402
from tests.run_helpers import tiny_config  # noqa: E402


def global_batch(vocab: int, N: int = 8, P: int = 3, T: int = 5) -> TrainBatch:
    g = torch.Generator().manual_seed(123)
    ids = torch.randint(2, vocab, (N, P + T), generator=g)
    attn = torch.ones(N, P + T, dtype=torch.long)
    comp = torch.zeros(N, T)
    for i in range(N):
        attn[i, :i % 2] = 0                                  # left padding of the prompt
        length = 1 + (i * 3) % T
        comp[i, :length] = 1
        attn[i, P + length:] = 0                             # right padding after the completion
    adv = torch.randn(N, generator=g)
    ref = -torch.rand(N, T, generator=g) * 3
    return TrainBatch(ids, attn, comp, adv, None, ref)


def run_update(model, batch, cfg, par=None):
    state = SimpleNamespace(model=model)
    state.optimizer, state.scheduler = build_optimizer(model, cfg.optim, 10)
    if par is not None:
        par.prepare(state, cfg)
    stats = policy_update(model if par is None else par.policy, state.optimizer, state.scheduler, batch, cfg.algorithm,
                          UpdateSettings(temperature=1.0, micro_batch_size=cfg.train.micro_batch_size,
                                         max_grad_norm=cfg.optim.max_grad_norm, parallel=par))
    if par is not None:
        par.after_update(state)
    return state.model, stats


def unit(mode: str, model_dir: str, reward: str, work: Path) -> None:
    results = {}
    for agg in ("seq-mean-token-mean", "token-mean"):
        cfg = build_config(overrides={"model.path": model_dir, "reward.functions": [reward], "train.parallel": mode,
                                      "train.prompts_per_step": 2, "rollout.num_generations": 4,
                                      "train.micro_batch_size": 2, "algorithm.beta": 0.04, "optim.lr": 1e-4,
                                      "algorithm.entropy_coef": 0.01, "algorithm.loss_agg_mode": agg})
        par = distributed.init(cfg)
        base, tok = load_policy(model_dir, dtype="float32", trust_remote_code=False)
        batch = global_batch(len(tok))
        single, s_stats = run_update(copy.deepcopy(base), batch, cfg)
        n = batch.input_ids.shape[0] // par.world_size
        rows = slice(par.rank * n, (par.rank + 1) * n)
        multi, m_stats = run_update(copy.deepcopy(base), batch.rows(rows), cfg, par)
        a, b = dict(single.named_parameters()), dict(multi.named_parameters())
        moved = max(float((a[k].detach() - base.state_dict()[k]).abs().max()) for k in a)
        results[agg] = {"max_diff": max(float((a[k] - b[k]).detach().abs().max()) for k in a), "moved": moved,
                        "loss": [s_stats.loss, m_stats.loss], "grad_norm": [s_stats.grad_norm, m_stats.grad_norm]}
    (work / f"unit-{par.rank}.json").write_text(json.dumps(results))


#: The world-size invariance run: 3 steps of 4 prompts (2 per rank, left-padded to their own length).
SAME_AS_ONE = {"train.max_steps": 3, "train.save_steps": 0, "train.prompts_per_step": 4}


def plain_sgd(model, cfg, total_steps, extra_groups=()):
    """grpo.training.update.build_optimizer's stand-in: SGD at optim.lr, constant (Adam's sign-like first step would
    turn float rounding of near-zero gradients into differences of lr)."""
    optimizer = torch.optim.SGD([{"params": [p for p in model.parameters() if p.requires_grad]}, *extra_groups],
                                lr=cfg.lr)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def recording_draws(draw, log: dict):
    """Wrap grpo.training.experience.draw_groups: log[global prompt index] = the G completions' ids and total rewards."""

    def draw_and_record(inputs, rows, index, cfg, device):
        from grpo.training.experience import completion_id_lists

        groups = draw(inputs, rows, index, cfg, device)
        ids, G = completion_id_lists(groups.gen), cfg.rollout.num_generations
        for j, p in enumerate(index):
            log[p] = {"ids": ids[j * G:(j + 1) * G], "rewards": groups.total[j * G:(j + 1) * G].tolist()}
        return groups

    return draw_and_record


def same_as_one(mode: str, model_dir: str, reward: str, work: Path) -> None:
    """Part 3 of the module docstring."""
    import grpo.training.experience
    import grpo.training.loop
    import grpo.training.update

    log: dict = {}
    grpo.training.experience.draw_groups = recording_draws(grpo.training.experience.draw_groups, log)
    grpo.training.loop.build_optimizer = grpo.training.update.build_optimizer = plain_sgd   # FSDP2 rebuilds it from grpo.training.update
    flat = tiny_config(Path(model_dir), reward, work / "same", **{**SAME_AS_ONE, "train.parallel": mode})
    result = train(build_config(overrides=flat))
    rank = int(os.environ["RANK"])                                    # the process group is gone after train()
    (work / f"draws-{rank}.json").write_text(json.dumps(log))
    torch.save({k: v.detach().clone() for k, v in result.model.state_dict().items()}, work / f"same-rank{rank}.pt")


def main() -> None:
    mode, work, model_dir, reward = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    if sys.argv[5:] == ["same"]:
        same_as_one(mode, model_dir, reward, work)
        return
    unit(mode, model_dir, reward, work)
    flat = tiny_config(Path(model_dir), reward, work / "run", **{"train.max_steps": 2, "train.save_steps": 1,
                                                                "train.parallel": mode})
    rank = torch.distributed.get_rank()
    result = train(build_config(overrides=flat))
    torch.save({k: v.detach().clone() for k, v in result.model.state_dict().items()}, work / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
