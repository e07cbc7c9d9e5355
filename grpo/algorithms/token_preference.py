"""lambda-GRPO: learnable token preferences (Wang et al., 2025, "lambda-GRPO: Unifying the GRPO Frameworks
with Learnable Token Preferences", arXiv 2510.06870).

GRPO, DAPO and Dr. GRPO differ in how the token losses of a group are weighted. Written as one weighted
token mean over the step,

    L = 1 / sum_i |o_i| * sum_i f(o_i) sum_t l_it

DAPO is f = 1 and GRPO is f(o_i) = sum_j |o_j| / (N |o_i|) (each completion weighs the same whatever its
length). lambda-GRPO learns the preference: within each group of G completions

    z_i = (|o_i| - mean_g |o|) / (std_g |o| + eps)         standardised length
    h_i = 1 + r z_i                                         lifted, kept >= h_min so that h^lambda is real
    f_i = G * softmax_g(h_i ^ lambda)                       sum_g f = G

with lambda a scalar trained with the policy by the same loss (lambda = 0: f = 1, DAPO; a group whose
lengths all tie: f = 1 for every lambda; lambda > 0 favours the longer completions of a group, lambda < 0
the shorter ones). The formula is as the paper's summaries state it (z, h = 1 + r z, softmax of h^lambda);
its full text was not available here, so std (unbiased), eps, h_min and the defaults of r, the initial
lambda and its learning rate are this library's choices (docs/variants.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo.algorithms.params import NoParams, param, require


def weighted_token_mean(values: torch.Tensor, mask: torch.Tensor, f: torch.Tensor, total_tokens: float) -> torch.Tensor:
    """The unified aggregation: sum_i f_i sum_t v_it m_it / total_tokens.  Shape: [n, T], [n, T], [n] -> []."""
    return (f.unsqueeze(1) * values * mask).sum() / total_tokens


def group_length_scores(mask: torch.Tensor, group_size: int, r: float, eps: float = 1e-6,
                        h_min: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor]:
    """h of every member of each row's group, and each row's place in its group (rows group by group).

        h_gj = max(1 + r (|o_gj| - mean_g) / (std_g + eps), h_min)     (std unbiased; 0 for a tie)

    Shape: mask [N, T] with N = B * G -> (h [N, G], position [N] long)
    """
    N = mask.shape[0]
    if group_size < 1 or N % group_size:
        raise ValueError(f"lambda-GRPO: {N} rows do not split into groups of {group_size}")
    lengths = mask.sum(dim=1).to(torch.float64).view(-1, group_size)                  # [B, G]
    z = (lengths - lengths.mean(dim=1, keepdim=True)) / (lengths.std(dim=1, keepdim=True).nan_to_num(0.0) + eps)
    h = (1.0 + r * z).clamp(min=h_min).to(torch.float32)                                # [B, G]
    position = torch.arange(N, device=mask.device) % group_size                         # [N]
    return h.repeat_interleave(group_size, dim=0), position                             # [N, G], [N]


def preference_weights(group_h: torch.Tensor, position: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """f_i = G * softmax_g(h_g ^ lambda)[i], differentiable in lambda (h^lambda = exp(lambda log h)).

    Shape: group_h [n, G], position [n], lam [] -> [n]
    """
    G = group_h.shape[1]
    logits = torch.exp(lam.to(group_h.dtype) * torch.log(group_h))                      # h^lambda [n, G]
    return G * torch.softmax(logits, dim=1).gather(1, position.unsqueeze(1)).squeeze(1)


class TokenPreference(torch.nn.Module):
    """The learnable lambda of lambda-GRPO (one scalar), with the lift r and the group size G."""

    def __init__(self, lam: float, r: float, group_size: int, device: torch.device):
        super().__init__()
        self.lam = torch.nn.Parameter(torch.tensor(float(lam), dtype=torch.float32, device=device))
        self.r, self.group_size = r, group_size

    def step_inputs(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Once per optimizer step, over the whole batch: (h [N, G], position [N])."""
        return group_length_scores(mask, self.group_size, self.r)

    def weights(self, group_h: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """f of the rows of a micro-batch: [n, G], [n] -> [n, 1], with gradient to lambda."""
        return preference_weights(group_h, position, self.lam).unsqueeze(1)

    def metrics(self) -> dict[str, float]:
        return {"lambda_grpo/lambda": float(self.lam.detach())}


@dataclass(frozen=True)
class LambdaParams:
    init: float = param(0.0, "Initial lambda (0 = DAPO's token mean).")
    r: float = param(0.5, "The lift r in h = 1 + r z (h is kept >= 1e-3).")
    lr: float = param(1e-2, "AdamW learning rate of lambda (its own optimizer group, no weight decay).")

    def __post_init__(self) -> None:
        require(self.lr > 0 and self.r >= 0, "lr must be > 0, r >= 0")


TOKEN_PREFERENCE_PARAMS: dict[str, type] = {"none": NoParams, "lambda": LambdaParams}
