"""Metrics of several samples per problem: unbiased pass@k and majority voting (maj@k).

pass@k (Chen et al., 2021, "Evaluating Large Language Models Trained on Code", eq. 1): with n samples
of which c are correct, the probability that at least one of k samples drawn without replacement is
correct,

    pass@k = 1 - C(n - c, k) / C(n, k)      (1 when n - c < k)

computed as 1 - prod_{i = n-c+1}^{n} (1 - k / i) to stay exact in floating point for large n.

maj@k (DeepSeekMath, section 4.1; Wang et al., 2023 "self-consistency"): the first k samples vote with
their extracted answers; answers that are equivalent form one group; the largest group wins, a tie going
to the group whose first answer came earliest; the problem counts as solved when the winning group's
answer is correct. Samples without an answer do not vote (no answer at all: not solved).
"""

from __future__ import annotations

from typing import Callable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with `n` samples, `c` of them correct (1 <= k <= n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def majority_vote(answers: Sequence[str | None], equivalent: Callable[[str, str], bool]) -> int | None:
    """The index of the sample whose answer wins the vote (the first member of the largest group of
    equivalent answers; ties: the group formed first), or None when no sample has an answer.

    `equivalent(a, b)` decides whether two answers are the same (e.g. math-verify equivalence).
    """
    groups: list[list[int]] = []                        # sample indices, in order of first appearance
    for i, answer in enumerate(answers):
        if answer is None:
            continue
        home = next((g for g in groups if equivalent(answers[g[0]], answer)), None)
        if home is None:
            groups.append([i])
        else:
            home.append(i)
    if not groups:
        return None
    best = max(len(g) for g in groups)
    return next(g[0] for g in groups if len(g) == best)


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int,
             equivalent: Callable[[str, str], bool]) -> float:
    """1.0 when the majority answer of the first `k` samples is a correct one, else 0.0."""
    winner = majority_vote(list(answers[:k]), equivalent)
    return float(winner is not None and bool(correct[winner]))
