"""Length and repetition shaping rewards: cosine-scaled length, n-gram repetition, soft overlong.

Lengths are in tokens when the ``completion_ids`` column is given (the trainer always passes it,
as TRL does); otherwise, e.g. in ``grpo rewards check`` without ``completion_ids``, a completion's
length is its number of whitespace-separated words.

Each reward has a factory taking its parameters (``make_cosine_length(max_len=...)``) and a
default instance; ``--reward name:key=value,...`` builds one from the factory.
"""

from __future__ import annotations

import math

import torch

from grpo.rewards.math_answer import math_correct, references
from grpo.rewards.scoring import RewardError
from grpo.rewards.text import as_text
from grpo.algorithms.shaping import soft_overlong_penalty


def completion_lengths(completions: list, completion_ids: list | None = None) -> list[int]:
    """Token counts from ``completion_ids``, else whitespace-separated word counts."""
    if completion_ids is not None:
        return [len(ids) for ids in completion_ids]
    return [len(as_text(c).split()) for c in completions]


def cosine_value(length: float, max_len: int, at_zero: float, at_max: float) -> float:
    """at_max + (at_zero - at_max) (1 + cos(pi min(L, L_max) / L_max)) / 2: at_zero at L = 0, at_max from L_max."""
    progress = min(length, max_len) / max_len
    return at_max + 0.5 * (at_zero - at_max) * (1.0 + math.cos(math.pi * progress))


def make_cosine_length(max_len: int = 1000, correct_at_0: float = 1.0, correct_at_max: float = 0.5,
                       wrong_at_0: float = -0.5, wrong_at_max: float = 0.0):
    """A cosine_length reward with the given L_max and end points (defaults as documented there)."""
    if max_len < 1:
        raise RewardError(f"cosine_length: max_len must be >= 1, got {max_len}")

    def cosine_length(prompts: list, completions: list, answer: list | None = None, solution: list | None = None,
                      completion_ids: list | None = None, **_: object) -> list[float | None]:
        """Cosine-scaled length reward (Yeo et al., 2025, "Demystifying Long Chain-of-Thought Reasoning"):

            r(L) = r_max + 0.5 (r_0 - r_max) (1 + cos(pi L / L_max)),  L clipped to L_max

        Correct answers (math_accuracy's comparison) go from r_0 = 1.0 at L = 0 down to r_max = 0.5 at
        L_max (shorter is better); wrong or missing answers from r_0 = -0.5 up to r_max = 0.0 (when
        wrong, longer reasoning is penalised less). Defaults: L_max = 1000; L in tokens from
        ``completion_ids``, else in whitespace-separated words. No reference -> None. (open-r1's
        config defaults cosine_min/max_value_wrong = 0.0 / -0.5 give wrong answers the opposite
        slope; these defaults follow the paper's.)
        """
        refs = references(len(completions), answer, solution)
        lengths = completion_lengths(completions, completion_ids)
        out: list[float | None] = []
        for c, ref, length in zip(completions, refs, lengths):
            ok = math_correct(c, ref)
            ends = (correct_at_0, correct_at_max) if ok else (wrong_at_0, wrong_at_max)
            out.append(None if ok is None else cosine_value(length, max_len, *ends))
        return out

    return cosine_length


def repeated_fraction(text: str, n: int) -> float:
    """1 - distinct / total over the word n-grams of the lower-cased text (0.0 with fewer than n words)."""
    tokens = text.lower().split()
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def make_repetition_penalty(ngram_size: int = 3, max_penalty: float = -1.0):
    """A repetition_penalty reward for the given n-gram size and (non-positive) maximum penalty."""
    if ngram_size < 1:
        raise RewardError(f"repetition_penalty: ngram_size must be >= 1, got {ngram_size}")
    if max_penalty > 0:
        raise RewardError(f"repetition_penalty: max_penalty must be <= 0, got {max_penalty}")

    def repetition_penalty(prompts: list, completions: list, **_: object) -> list[float]:
        """N-gram repetition penalty (Yeo et al., 2025; TRL/open-r1 get_repetition_penalty_reward):

            r = max_penalty * (1 - distinct n-grams / n-grams)

        over the lower-cased whitespace-separated words of the whole completion. Defaults n = 3,
        max_penalty = -1.0. 0.0 for no repetition and for completions shorter than n words;
        negative otherwise (down to max_penalty).
        """
        return [max_penalty * f if (f := repeated_fraction(as_text(c), ngram_size)) else 0.0 for c in completions]

    return repetition_penalty


def make_soft_overlong(max_len: int = 1000, cache: int = 200, factor: float = 1.0):
    """A soft_overlong reward with L_max = max_len and L_cache = cache (grpo.algorithms.shaping's penalty)."""
    if not 0 <= cache <= max_len:
        raise RewardError(f"soft_overlong: need 0 <= cache <= max_len, got cache={cache}, max_len={max_len}")

    def soft_overlong(prompts: list, completions: list, completion_ids: list | None = None,
                      **_: object) -> list[float]:
        """DAPO soft overlong punishment (Yu et al., 2025, eq. 13) as a reward:

            0 for L <= L_max - L_cache;  ((L_max - L_cache) - L) / L_cache up to L_max;  -1 beyond,

        times ``factor``. Defaults L_max = 1000, L_cache = 200 (DAPO's 20%), factor 1.0. L in tokens
        from ``completion_ids`` (else whitespace-separated words). The same penalty
        (grpo.algorithms.shaping.soft_overlong_penalty) as the canonical trainer setting
        ``algorithm.overlong_cache_fraction`` (L_max = rollout.max_new_tokens), for configs written as
        reward functions; configuring both is an error.
        """
        lengths = torch.tensor(completion_lengths(completions, completion_ids), dtype=torch.float32, device="cpu")
        return soft_overlong_penalty(lengths, max_len, cache, factor).tolist()

    return soft_overlong


cosine_length = make_cosine_length()
repetition_penalty = make_repetition_penalty()
soft_overlong = make_soft_overlong()
