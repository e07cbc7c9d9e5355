import itertools

import pytest

from grpo.algorithms.sampling_metrics import maj_at_k, majority_vote, pass_at_k


@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_pass_at_k_equals_brute_force_enumeration(n):
    """pass@k = the share of all k-subsets of the n samples holding at least one correct sample."""
    for c in range(n + 1):
        correct = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(range(n), k))
            brute = sum(any(correct[i] for i in s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)


def test_pass_at_k_rejects_impossible_counts():
    for n, c, k in [(4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)]:
        with pytest.raises(ValueError, match="pass_at_k needs"):
            pass_at_k(n, c, k)


def same(a: str, b: str) -> bool:
    return a.replace(" ", "") == b.replace(" ", "")          # "1 + 1" and "1+1" are one answer


@pytest.mark.parametrize("answers,winner", [
    (["2", "3", "2"], 0),                                     # plain majority
    (["3", "2", "2"], 1),                                     # the group's first member represents it
    (["1 + 1", "5", "1+1"], 0),                               # equivalent answers form one group
    (["4", "5"], 0),                                          # a tie: the group formed first wins
    (["5", "4", "4", "5"], 0),                                # a 2-2 tie: "5" came first
    ([None, "7", None], 1),                                   # no answer: no vote
    ([None, None], None),                                     # nobody answered
])
def test_majority_vote_with_ties(answers, winner):
    assert majority_vote(answers, same) == winner


def test_maj_at_k_uses_the_first_k_samples():
    answers = ["5", "4", "4", "4"]
    correct = [True, False, False, False]
    assert maj_at_k(answers, correct, 1, same) == 1.0        # only "5" votes
    assert maj_at_k(answers, correct, 2, same) == 1.0        # 1-1 tie: "5" first
    assert maj_at_k(answers, correct, 3, same) == 0.0        # "4" wins 2-1 and is wrong
    assert maj_at_k([None] * 4, correct, 4, same) == 0.0
