"""The memory planner: from shapes and a budget to the update's micro-batch tokens, activation checkpointing
and LM-head chunk (`train.memory_budget_gib`, docs/performance.md "Long completions and the memory budget").

Pure arithmetic, no tensors: :func:`plan_memory` takes the model's shape (:class:`ModelShape`), the step's
shape (:class:`StepShape`), the memory already in use and the budget, and returns a :class:`MemoryPlan`.
The runtime (grpo/training/runtime.py) measures what is in use and chooses the default budget.

A step's peak is the largest of three phases, each linear in the tokens it holds (nothing in them grows
with the square of the length: attention runs in torch's fused kernels, the LM head in chunks):

    rollout    in_use + slack + moments + KV cache (2 L kv d values per token: B P + N T tokens) + its weight copies
    reference  in_use + slack + moments + M' tokens x no-grad activations (one layer at a time) + LM-head chunk
               (+ the reference's weights, loaded for this phase only, when train.ref_offload keeps them elsewhere)
    update     in_use + slack + moments + gradients + M tokens x stored activations + LM-head chunk

with M the padded tokens of the largest micro-batch (rows x the longest row, at least one whole row), M' the
same for the no-grad passes (M unless `train.logprob_micro_batch_tokens` says otherwise, :func:`no_grad_budget`),
"moments" AdamW's two float32 moments (counted here, and taken out of `in_use` by the runtime when the optimizer
already holds them: grpo.training.update.allocate_adam_state makes them before the first step) and
"gradients" the trainable parameters' gradients, which live only in the update: the loop frees them after each
optimizer step (grpo.training.loop.update); "slack" what the process gains after its first step beyond
those terms (:func:`runtime_allowance`, measured). Stored activations per token, in values of the compute dtype (measured on Qwen2 shapes, see
:data:`LAYER_VALUES`): without checkpointing every layer's a H + b I; with checkpointing each layer's input
H plus one layer's a H + b I (recomputed in the backward pass).

Choices are tried from fastest to leanest: no checkpointing with the default LM-head chunk, then smaller
chunks (halving down to :data:`MIN_CHUNK`), then checkpointing with the same chunks. The first that fits
is taken; an explicit setting (`train.gradient_checkpointing` true/false, `train.logprob_chunk_size` > 0,
`train.micro_batch_tokens` != 0) is never changed. When even the leanest choice does not fit the budget,
:class:`MemoryBudgetError` names `train.memory_budget_gib` and the estimate, before the first step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from grpo.config import ConfigError

GIB = 2 ** 30
#: Values stored per token and layer for the backward pass, as (a, b) in a x hidden + b x intermediate: 14,848
#: on the 100M Qwen2 (hidden 768, intermediate 2048), whose update measured 0.70 MiB per token over 12 layers
#: (15,200 float32 values per layer; `bench/long_completions.py --update-only 512,1024,2048`, 714 MiB per 1k
#: tokens) and 0.01-0.08 MiB per token with checkpointing (the estimate here: 0.10).
LAYER_VALUES = (10.0, 3.5)
#: The same with `train.lean_layers` (grpo.modeling.lean_layers): 9,472 on the 100M Qwen2, where the saved
#: tensors counted 9,352 values per token and layer (15,053 without) and the update measured 426 MiB per 1k
#: tokens (9,090 float32 values per layer; 683 MiB stock in the same session).
LEAN_LAYER_VALUES = (7.0, 2.0)
#: Transient values per token of a no-grad forward (one layer's temporaries alive at a time): a H + b I; 14,336
#: on the 100M Qwen2, which measured 0.055 MiB (14,400 values) per token (backbone, 1024 -> 2048 tokens).
NO_GRAD_VALUES = (8.0, 4.0)
#: Values per token beyond the layers in the update: the final hidden state, its gradient, the embedding output.
EXTRA_VALUES_PER_HIDDEN = 4.0
#: float32 copies per logit of one LM-head chunk alive at once (logits, log-softmax, its exp or gradient).
HEAD_COPIES = 3
#: The allowance for what a process holds after its first step beyond every term above: freed activations kept
#: by glibc's heap for reuse, small allocations and library workspaces. Measured on CPU (2026-11-25, bench/grid.py
#: shapes, full fine-tuning, default micro-batches; peak RSS per phase against the estimate without it), at the
#: 1 MiB `cpu.mmap_threshold_mb` of the time: 7-110 MiB at 2.2M-38.6M parameters, 82-157 MiB at 100.7M, 503 MiB
#: at 299.5M (update phase); 128 MiB + 2 bytes per parameter covered each. With glibc's own threshold (the default
#: since) the heap keeps more at long rows: 3537 MiB measured at 100.7M with 1036-token micro-batches (G = 8,
#: 1024 new tokens) against 3482 MiB estimated with 2 bytes, so 4 bytes per trainable parameter (~140 MiB to spare).
RUNTIME_BYTES = 128 * 2 ** 20
RUNTIME_BYTES_PER_PARAM = 4
#: The smallest LM-head chunk the planner tries (tokens).
MIN_CHUNK = 16
#: Default tokens per LM-head chunk: about 2**23 float32 logits (32 MiB), as grpo.modeling.logprobs.
CHUNK_LOGITS = 2 ** 23


class MemoryBudgetError(ConfigError):
    """Even the leanest plan does not fit `train.memory_budget_gib` (one line naming the key and the estimate)."""


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs to know about the policy (read off its config and parameters)."""

    hidden: int
    intermediate: int
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    trainable_params: int
    param_bytes: int = 4           # bytes per parameter of the trainable weights (model.dtype)
    act_bytes: int = 4             # bytes per activation value (2 under bf16 / fp16 autocast)
    lean_layers: bool = False      # the MLPs save fewer activations (grpo.modeling.lean_layers; float32 only)
    packed_rollout: bool = False   # the rollout packs every projection and the head (CPU float32 / native bf16)
    slack_bytes: int = 0           # runtime_allowance(trainable_params), set by grpo.training.runtime.model_shape
    offloaded_ref_bytes: int = 0   # a reference kept in a file or host memory (train.ref_offload), loaded for its pass
    rollout_bytes: int = 0         # bytes per value of the rollout's weight copies (rollout.precision); 0 = act_bytes


@dataclass(frozen=True)
class StepShape:
    """One step's rollout and update: N = B x G rows of P prompt + T completion tokens."""

    rows: int                       # N completions per step (per rank)
    prompts: int                    # B distinct prompts
    prompt_tokens: int              # P, the longest prompt
    new_tokens: int                 # T = rollout.max_new_tokens
    own_rollout: bool = True        # the rollout's KV cache and weight copies are made per step in this process;
                                    # False under vLLM (its cache is reserved once, already in use, or elsewhere)


@dataclass(frozen=True)
class MemoryPlan:
    """The choice and its estimate. micro_batch_tokens is the value to pass as the update's token budget."""

    micro_batch_tokens: int
    gradient_checkpointing: bool
    logprob_chunk_size: int
    estimate_bytes: int             # the estimated peak of the step (largest phase)
    budget_bytes: int
    phases: tuple[tuple[str, int], ...] = ()   # (rollout | reference | update, estimated bytes)
    chosen_by: str = "planner"      # planner | user (every setting explicit)
    no_grad_tokens: int = 0         # token budget of the no-grad passes (reference, old policy); 0 = micro_batch_tokens
    grad_buffer: bool = False       # the update's gradients as views of one flat buffer (the runtime's choice)

    @property
    def logprob_tokens(self) -> int:
        """The token budget to pass to the no-grad log-prob passes."""
        return self.no_grad_tokens or self.micro_batch_tokens

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(estimate_gib=round(self.estimate_bytes / GIB, 3), budget_gib=round(self.budget_bytes / GIB, 3),
                 phases={k: round(v / GIB, 3) for k, v in self.phases})
        return d

    def describe(self) -> str:
        """One log line: the choice, the estimate against the budget, the phases."""
        phases = ", ".join(f"{k} {v / GIB:.2f}" for k, v in self.phases)
        return (f"memory plan ({self.chosen_by}): micro_batch_tokens={self.micro_batch_tokens}, "
                f"logprob_micro_batch_tokens={self.logprob_tokens}, "
                f"gradient_checkpointing={str(self.gradient_checkpointing).lower()}, "
                f"logprob_chunk_size={self.logprob_chunk_size}; estimated peak {self.estimate_bytes / GIB:.2f} GiB "
                f"of train.memory_budget_gib={self.budget_bytes / GIB:.2f} ({phases} GiB)")


def default_chunk(vocab: int) -> int:
    """Tokens per LM-head chunk for about :data:`CHUNK_LOGITS` logits (at least :data:`MIN_CHUNK`)."""
    return max(MIN_CHUNK, CHUNK_LOGITS // max(vocab, 1))


def gradient_bytes(m: ModelShape) -> int:
    """The trainable parameters' gradients (the weights' dtype): alive only in the update (the loop frees them
    after each optimizer step)."""
    return m.trainable_params * m.param_bytes


def runtime_allowance(trainable_params: int) -> int:
    """Bytes a process gains after its first step beyond the planner's terms (see :data:`RUNTIME_BYTES`)."""
    return RUNTIME_BYTES + RUNTIME_BYTES_PER_PARAM * trainable_params


def moment_bytes(m: ModelShape) -> int:
    """AdamW's two float32 moments of the trainable parameters: alive from the first step on."""
    return m.trainable_params * 8


def kv_cache_bytes(m: ModelShape, s: StepShape) -> int:
    """The rollout's cache: keys and values of every layer, the prompt once per prompt, completions per row, in the
    parameters' dtype: under autocast the keys leave rotary in the float32 of cos / sin (the values are cast to
    the keys' dtype, grpo.modeling.decoder), so a float32 model's cache is float32 at any precision."""
    tokens = s.prompts * s.prompt_tokens + s.rows * s.new_tokens
    return 2 * m.layers * m.kv_heads * m.head_dim * m.param_bytes * tokens


def rollout_value_bytes(m: ModelShape) -> int:
    """Bytes per value of the rollout's weight copies: `rollout.precision`'s, else the activations'."""
    return m.rollout_bytes or m.act_bytes


def layer_values(hidden: int, intermediate: int, lean: bool) -> float:
    """Activation values one layer keeps per token for the backward pass: a H + b I (:data:`LAYER_VALUES`, or
    :data:`LEAN_LAYER_VALUES` with `train.lean_layers`)."""
    a, b = LEAN_LAYER_VALUES if lean else LAYER_VALUES
    return a * hidden + b * intermediate


def stored_values_per_token(m: ModelShape, checkpointing: bool) -> float:
    """Activation values kept per token for the backward pass (see the module docstring)."""
    layer = layer_values(m.hidden, m.intermediate, m.lean_layers)
    kept = m.layers * m.hidden + layer if checkpointing else m.layers * layer
    return kept + EXTRA_VALUES_PER_HIDDEN * m.hidden


def head_bytes(m: ModelShape, chunk: int, tokens: int) -> int:
    """One LM-head chunk of a micro-batch of `tokens` tokens: min(chunk, tokens) x vocab float32 logits,
    HEAD_COPIES of them alive."""
    return HEAD_COPIES * 4 * min(chunk, tokens) * m.vocab


def micro_batch_padded_tokens(s: StepShape, tokens: int) -> int:
    """Padded tokens of the largest micro-batch for a token budget (<= 0: no limit): whole rows of P + T
    tokens, as many as fit in `tokens`, at least one, at most N (grpo.modeling.logprobs.bucketed_micro_batches)."""
    row = s.prompt_tokens + s.new_tokens
    rows = s.rows if tokens <= 0 else min(s.rows, max(1, tokens // row))
    return rows * row


def fused_weight_bytes(m: ModelShape) -> int:
    """The rollout's copies of weights (grpo.modeling.rollout_weights), made for one rollout and freed after it:
    the concatenated q/k/v and gate/up weights; when packed (CPU float32 / bf16), o, down and the LM head too.
    The copies are in the products' dtype: the narrower of the parameters' and the rollout's (autocast's)."""
    qkv_gate_up = m.hidden * (m.hidden + 2 * m.kv_heads * m.head_dim + 2 * m.intermediate)
    width = min(rollout_value_bytes(m), m.param_bytes)
    if not m.packed_rollout:
        return m.layers * qkv_gate_up * width
    o_down = m.hidden * (m.hidden + m.intermediate)
    return (m.layers * (qkv_gate_up + o_down) + m.vocab * m.hidden) * width


def phase_bytes(m: ModelShape, s: StepShape, in_use: int, tokens: int, checkpointing: bool,
                chunk: int) -> dict[str, int]:
    """Estimated peak of each phase of a step (bytes) for a token budget, checkpointing and LM-head chunk."""
    base = in_use + m.slack_bytes + moment_bytes(m)
    M = micro_batch_padded_tokens(s, tokens)
    no_grad = (NO_GRAD_VALUES[0] * m.hidden + NO_GRAD_VALUES[1] * m.intermediate) * m.act_bytes
    head = head_bytes(m, chunk, M)
    return {"rollout": base + (kv_cache_bytes(m, s) + fused_weight_bytes(m) if s.own_rollout else 0),
            "reference": base + m.offloaded_ref_bytes + int(M * no_grad) + head,
            "update": base + gradient_bytes(m) + int(M * stored_values_per_token(m, checkpointing) * m.act_bytes)
            + head}


#: Auto token budget of the no-grad passes, when the update's is smaller: a no-grad pass keeps one layer's
#: temporaries at a time (NO_GRAD_VALUES per token), so its micro-batches can be larger than the update's at little
#: cost. Measured in `grpo train` against the update's 256 tokens (Xeon host, 2026-11-26, float32, 2 alternating
#: rounds): reference pass and scoring 1.60 -> 1.27 s per step on qwen2-100m (peak RSS +7 MiB; 1.30 s at 1408
#: tokens), 4.2 -> 3.4 s on a 299.5M model (hidden 1024, 24 layers; +17 MiB). 1024 tokens there: 3.94 -> 3.44 s
#: but +79 MiB, and 1216 tokens with a bf16 rollout +425 MiB: glibc's heap keeps the larger temporaries' space
#: into the update, so the budget stays at the smaller value.
NO_GRAD_TOKENS = 704


def no_grad_budget(tokens: int, configured: int = 0) -> int:
    """Tokens per micro-batch of the no-grad passes (reference, old policy, entropy): `configured`
    (`train.logprob_micro_batch_tokens`, -1 = no limit) when set, else (0) the update's `tokens` (-1 = no limit) or
    :data:`NO_GRAD_TOKENS`, whichever is larger."""
    return configured or (tokens if tokens < 0 else max(tokens, NO_GRAD_TOKENS))


def _chunks(m: ModelShape, chunk: int) -> list[int]:
    """LM-head chunks to try: the explicit one, else the default halving down to MIN_CHUNK."""
    if chunk > 0:
        return [chunk]
    out = [default_chunk(m.vocab)]
    while out[-1] // 2 >= MIN_CHUNK:
        out.append(out[-1] // 2)
    return out


def plan_memory(m: ModelShape, s: StepShape, *, in_use: int, budget: int, auto_tokens: int,
                micro_batch_tokens: int = 0, gradient_checkpointing: bool | None = None,
                logprob_chunk_size: int = 0, logprob_micro_batch_tokens: int = 0) -> MemoryPlan:
    """The fastest (checkpointing, LM-head chunk) whose estimated peak fits `budget` bytes.

    `in_use`: bytes the process holds already (weights, reference, runtime); `auto_tokens`: the speed
    heuristic's micro-batch tokens (used when `micro_batch_tokens` is 0, lowered to what fits, never below
    one row); the settings as configured (0 / None = auto); `logprob_micro_batch_tokens`: the no-grad passes'
    own budget (0 = the update's, :func:`no_grad_budget`). Raises :class:`MemoryBudgetError` when nothing
    fits, naming the leanest estimate.
    """
    explicit = micro_batch_tokens != 0 and gradient_checkpointing is not None and logprob_chunk_size > 0
    row = s.prompt_tokens + s.new_tokens
    lean = None
    for ckpt in ([gradient_checkpointing] if gradient_checkpointing is not None else [False, True]):
        for chunk in _chunks(m, logprob_chunk_size):
            tokens = micro_batch_tokens
            if tokens == 0:   # auto: the speed heuristic, lowered to the largest whole-row micro-batch that fits
                fixed = phase_bytes(m, s, in_use, row, ckpt, chunk)
                per_token = stored_values_per_token(m, ckpt) * m.act_bytes
                fits = int((budget - fixed["update"]) // per_token) + row   # tokens beyond one row that fit
                tokens = max(row, min(max(auto_tokens, row), fits - fits % row)) if auto_tokens > 0 else row
            phases = phase_bytes(m, s, in_use, tokens, ckpt, chunk)
            at_update_budget = phases["reference"]
            no_grad = no_grad_budget(tokens, logprob_micro_batch_tokens)
            choices = (no_grad, tokens) if not logprob_micro_batch_tokens and no_grad != tokens else (no_grad,)
            for ng in choices:   # auto: the no-grad passes' larger budget, else the update's when that does not fit
                phases["reference"] = (at_update_budget if ng == tokens
                                       else phase_bytes(m, s, in_use, ng, ckpt, chunk)["reference"])
                plan = MemoryPlan(tokens, ckpt, chunk, max(phases.values()), budget, tuple(phases.items()),
                                  "user" if explicit else "planner", ng)
                if plan.estimate_bytes <= budget:
                    return plan
                lean = plan
    raise MemoryBudgetError(
        f"train.memory_budget_gib={budget / GIB:.3g} is too small: the leanest plan (gradient_checkpointing="
        f"{str(lean.gradient_checkpointing).lower()}, logprob_chunk_size={lean.logprob_chunk_size}, "
        f"micro_batch_tokens={lean.micro_batch_tokens}, rows of {row} tokens) needs an estimated "
        f"{lean.estimate_bytes / GIB:.3g} GiB (" + ", ".join(f"{k} {v / GIB:.3g}" for k, v in lean.phases)
        + " GiB); raise train.memory_budget_gib or lower rollout.max_new_tokens / train.prompts_per_step")
