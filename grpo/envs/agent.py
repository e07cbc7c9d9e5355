"""The driver of a multi-turn rollout (grpo/rollout/multiturn.py): it reads each episode's text as it is
generated, runs the environment when a tool call closes, and hands back the observation tokens.

Per episode it keeps the message list reward functions receive (``{"role": "assistant"|"tool",
"content": ...}``), the turn rewards of ``info["reward"]`` and the tool counters of the metrics. A turn
cap (`rollout.max_turns` tool calls answered; the next call ends the episode) and the token cap of the
sampler bound every episode. An environment that raises or hangs (`rollout.tool_timeout_s`) is an
error observation, never the end of the run.

Text: tool calls are found and parsed in the raw text of a turn (special tokens kept: a tokenizer may make
``<tool_call>`` a special token); the messages and the final answer the environment scores are the turn's
text as TRL gives completions to rewards (special tokens skipped, grpo.rollout.eos.completion_text), the
tool-call tags kept. Any EOS id (grpo.rollout.eos.eos_token_ids) is left out of both.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from grpo.envs.environment import resolve
from grpo.envs.parsers import CLOSE, OPEN, ToolCall, ToolCallError, call_body, ends_with_call
from grpo.rewards.calling import RewardTimeout, in_thread
from grpo.rollout.eos import completion_text


def _step(env: Any, action: Any, timeout_s: float) -> tuple[str, bool, dict]:
    """env.step(action), sync or async, contained: an exception or a hang is an error observation."""
    run = lambda: resolve(env.step(action))  # noqa: E731
    out = in_thread(run, timeout_s) if timeout_s > 0 else _guarded(run)
    if isinstance(out, RewardTimeout):
        return f"error: the environment did not answer within {timeout_s:g} s", False, {"error": True,
                                                                                       "timed_out": True}
    if isinstance(out, BaseException):
        return f"error: {type(out).__name__}: {out}", False, {"error": True}
    try:
        observation, done, info = out
    except (TypeError, ValueError):
        return "error: the environment's step() must return (observation, done, info)", False, {"error": True}
    return str(observation), bool(done), dict(info or {})


def tag_ids(tokenizer, tags: Sequence[str]) -> set[int]:
    """The ids of the `tags` that are single tokens of `tokenizer` (the tool-call tags a parser reads)."""
    ids = (tokenizer.convert_tokens_to_ids(tag) for tag in tags)
    return {i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id}


def _guarded(run: Callable[[], Any]) -> Any:
    try:
        return run()
    except Exception as e:  # noqa: BLE001 - reported to the model and the metrics
        return e


class EpisodeDriver:
    """One driver per rollout call: row r of the sampler is episode r, played in `envs[r]`."""

    def __init__(self, tokenizer, envs: list[Any], parser: Callable[[str], ToolCall], *, max_turns: int,
                 observation_format: str, timeout_s: float, max_chars: int, eos_token_ids: Sequence[int] = ()):
        self.tokenizer, self.envs, self.parser = tokenizer, envs, parser
        self.eos = set(eos_token_ids) or {tokenizer.eos_token_id}     # left out of every text
        self.tags = tag_ids(tokenizer, (OPEN, CLOSE))                  # kept in the messages even when special
        self.max_turns, self.format, self.timeout_s, self.max_chars = max_turns, observation_format, timeout_s, max_chars
        n = len(envs)
        self.turn: list[list[int]] = [[] for _ in range(n)]           # token ids of the model's current turn
        self.tail: list[str] = [""] * n                                # the turn's last characters, decoded token by token
        self.messages: list[list[dict]] = [[] for _ in range(n)]
        self.turn_rewards: list[list[float]] = [[] for _ in range(n)]
        self.calls, self.errors, self.timeouts, self.parse_errors = [0] * n, [0] * n, [0] * n, [0] * n

    def _raw(self, ids: list[int]) -> str:
        """What the tool-call parser reads: every token's text but the EOS ids'."""
        return self.tokenizer.decode([t for t in ids if t not in self.eos], skip_special_tokens=False)

    def _text(self, ids: list[int]) -> str:
        """What rewards and the environment read: special tokens skipped, the tool-call tags kept."""
        return completion_text(self.tokenizer, [t for t in ids if t not in self.eos], keep=self.tags)

    def _record(self, row: int, info: dict) -> None:
        self.errors[row] += bool(info.get("error"))
        self.timeouts[row] += bool(info.get("timed_out"))
        if isinstance(info.get("reward"), (int, float)):
            self.turn_rewards[row].append(float(info["reward"]))

    def after_token(self, row: int, token: int) -> tuple[list[int], bool]:
        """Called for every sampled token (the rollout's hot loop): one token is decoded, and the whole turn
        only when its tail closes a tool call."""
        self.turn[row].append(token)
        self.tail[row] = (self.tail[row] + self._raw([token]))[-2 * len(CLOSE):]
        if not ends_with_call(self.tail[row]):
            return [], False
        raw = self._raw(self.turn[row])                            # exact (a token may not decode alone)
        if not ends_with_call(raw):
            return [], False
        self.messages[row].append({"role": "assistant", "content": self._text(self.turn[row])})
        self.turn[row], self.tail[row] = [], ""
        if self.calls[row] + self.parse_errors[row] >= self.max_turns:
            return [], True                                        # the turn cap: this call is not answered
        try:
            call = self.parser(call_body(raw))
        except ToolCallError as e:
            self.parse_errors[row] += 1
            observation, done, info = f"error: {e}", False, {"error": True}
        else:
            self.calls[row] += 1
            observation, done, info = _step(self.envs[row], call, self.timeout_s)
        if len(observation) > self.max_chars:                     # any environment's output is bounded too
            observation = observation[:self.max_chars] + f"... [cut at {self.max_chars} characters]"
        self._record(row, info)
        if done:
            return [], True
        self.messages[row].append({"role": "tool", "content": observation})
        return self.tokenizer.encode(self.format.format(observation), add_special_tokens=False), False

    def finish(self, row: int, ended_by_eos: bool) -> None:
        text = self._text(self.turn[row])
        self.turn[row], self.tail[row] = [], ""
        if text or not self.messages[row]:
            self.messages[row].append({"role": "assistant", "content": text})
        if ended_by_eos:                                           # the final answer: the env may score it
            _, _, info = _step(self.envs[row], text, self.timeout_s)
            self._record(row, info)

    def metrics(self) -> dict[str, float]:
        n = max(len(self.envs), 1)
        return {"tools/calls_per_episode": sum(self.calls) / n, "tools/use_rate": sum(c > 0 for c in self.calls) / n,
                "tools/errors": float(sum(self.errors)), "tools/timeouts": float(sum(self.timeouts)),
                "tools/parse_errors": float(sum(self.parse_errors)),
                "env/turns_mean": sum(len([m for m in ms if m["role"] == "assistant"]) for ms in self.messages) / n}
