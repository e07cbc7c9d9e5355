"""Memory-lean training layers (`train.lean_layers`): RMSNorm and the SwiGLU MLP of Llama-style decoders
as autograd functions that save fewer activations for the backward pass, and recompute the rest there.

Stock autograd keeps, per token and layer of a Qwen2 block, the normed hidden state of both RMSNorms
(besides their inputs) and four intermediate-wide tensors of the MLP: gate g, silu(g), up u and
a = silu(g) * u. The lean functions keep only the inputs x and the per-row 1/rms of each norm, and g and u
of the MLP; the elementwise values are recomputed in the backward pass (a few elementwise passes, no
extra GEMM). Measured on the 100M Qwen2 (tests/modeling/test_lean_layers.py counts the saved tensors):
15,053 -> 9,352 float32 values per token and layer (-38 %), which the memory planner counts
(grpo.training.memory_plan.LEAN_LAYER_VALUES) when it sizes micro-batches and checkpointing for a budget.
Off by default: the recompute made the 0.8M demo model's updates 22 % slower; on the 100M model it was
speed-neutral (docs/performance.md).

Values equal the stock modules' up to float32 rounding (tested against float64). The lean path runs only
where it is exact and plain: with autograd on, outside autocast, input and weights of one dtype, and
for the MLP only when its three projections are bias-free ``nn.Linear`` layers (or oneDNN's
a runtime's class of the same math, whose GEMMs it keeps: grpo.modeling.hooks) with a SiLU activation. Anything else
(LoRA adapters, ``train.precision`` bf16 / fp16, no-grad rollouts and reference passes) runs the stock
forward. Device-agnostic: pure torch operations on the input's device.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from grpo.modeling.precision import active_dtype
from grpo.modeling.hooks import LayerGemm, grad_into, installed, layer_gemm, plain_linear
from grpo.modeling.in_place import accumulate_grad

#: RMSNorm classes whose forward is  weight * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(x.dtype).
RMS_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm", "Qwen2MoeRMSNorm",
             "Qwen3MoeRMSNorm", "Olmo2RMSNorm")


class RMSNormFn(torch.autograd.Function):
    """y = w * (x * r).to(x.dtype), r = 1 / sqrt(mean(x^2) + eps) (Zhang & Sennrich 2019, arXiv 1910.07467),
    in float32; saves x and r [..., 1] only. Backward, with h = x r and gh = dL/dh = (gy * w) in float32:
    dL/dx = r (gh - h mean(gh h)),  dL/dw = sum over rows of gy * h.

    Shape: x [..., H], weight [H] -> [..., H]
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        ew = installed().elementwise                                            # one pass (cpu.elementwise_kernel)
        if ew is not None and ew.applies(x, weight):
            y, r = ew.rms_norm_forward(x, weight, eps)
            ctx.save_for_backward(x, weight, r)
            return y
        xf = x.float()
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)                 # [..., 1]
        ctx.save_for_backward(x, weight, r)
        return weight * (xf * r).to(x.dtype)

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        x, weight, r = ctx.saved_tensors
        gy = gy.contiguous()
        ew = installed().elementwise
        if ew is not None and ew.applies(gy, x, weight):
            gx, gw = ew.rms_norm_backward(gy, x, weight, r, *ctx.needs_input_grad[:2])
            return gx, gw, None
        h = x.float() * r                                                        # [..., H]
        gx = gw = None
        if ctx.needs_input_grad[1]:
            gw = (gy * h.to(x.dtype)).reshape(-1, h.shape[-1]).sum(0).to(weight.dtype)    # [H]
        if ctx.needs_input_grad[0]:
            gh = (gy * weight).float()
            gx = (r * (gh - h * (gh * h).mean(-1, keepdim=True))).to(x.dtype)            # [..., H]
        return gx, gw, None


def _gemm(gemm: LayerGemm | None, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a b^T, by the projections' own GEMMs when their class has them (grpo.modeling.hooks.layer_gemm: the CPU
    runtime's oneDNN linear, `cpu.cpu_matmul`), else torch's. Shape: a [M, K], b [N, K] -> [M, N]"""
    return gemm.mm(a, b) if gemm is not None else a @ b.t()


class SwiGLUFn(torch.autograd.Function):
    """The gated MLP of Llama-style models (Shazeer 2020, arXiv 2002.05202):
    y = (silu(x Wg^T) * (x Wu^T)) Wd^T, saving x, g = x Wg^T and u = x Wu^T only. Backward, with
    s = sigmoid(g), a = g s u and ga = gy Wd: dWd = gy^T a, du = ga g s, dg = ga u s (1 + g (1 - s)),
    dx = dg Wg + du Wu, dWg = dg^T x, dWu = du^T x.

    `into`: the weight gradients are accumulated into ``.grad`` in place (the projections are
    linears that say so, grpo.modeling.hooks.grad_into; with the class's own GEMMs their whole product
    becomes ``.grad`` or is added to it), autograd receives None for them. Returned to autograd instead, the oneDNN
    products raised the update's peak RSS by ~200 MiB on a 100.7M model at 32 new tokens (bench shapes, Zen 5).

    Shape: x [M, H], Wg / Wu [I, H], Wd [H, I] -> [M, H]
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, wd: torch.Tensor, gemm: LayerGemm | None,
                into: bool = False):
        g, u = _gemm(gemm, x, wg), _gemm(gemm, x, wu)                            # [M, I]
        ctx.save_for_backward(x, g, u, wg, wu, wd)
        ctx.gemm, ctx.into = gemm, into
        ctx.params = (wg, wu, wd) if into else None  # the leaves themselves: saved tensors may come back as aliases
        ew = installed().elementwise
        a = ew.swiglu_forward(g, u) if ew is not None and ew.applies(g, u) else F.silu(g).mul_(u)
        return _gemm(gemm, a, wd)                                                # [M, H]

    @staticmethod
    def _weight_grad(ctx, i: int, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
        """a^T b, the gradient of weight input `i`: returned, or (`into`) added to that parameter's .grad.

        Shape: a [M, N], b [M, K] -> [N, K]
        """
        if not ctx.needs_input_grad[i]:
            return None
        if ctx.into and ctx.gemm is not None:    # the class's GEMMs: the whole product made .grad or added to it
            ctx.gemm.add_weight_grad_(ctx.params[i - 1], a, b, whole=True)
            return None
        if ctx.into:
            accumulate_grad(ctx.params[i - 1], a.t(), b)
            return None
        return _gemm(ctx.gemm, a.t(), b.t())

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        x, g, u, wg, wu, wd = ctx.saved_tensors
        mm, ew = ctx.gemm, installed().elementwise
        gy = gy.contiguous()
        ga = _gemm(mm, gy, wd.t())                                               # [M, I] = gy Wd
        if ew is not None and ew.applies(g, u, ga):                              # one pass (cpu.elementwise_kernel)
            dg, du, a = ew.swiglu_backward_(g, u, ga)
            gwd = SwiGLUFn._weight_grad(ctx, 3, gy, a)                           # [H, I] = gy^T a
            del a
        else:
            s = torch.sigmoid(g)
            gs = g * s                                                           # silu(g)
            gwd = SwiGLUFn._weight_grad(ctx, 3, gy, gs * u)                      # [H, I] = gy^T a
            du = ga * gs
            ds = torch.addcmul(gs, s, gs, value=-1).add_(s)      # silu'(g) = s (1 + g (1 - s)) = gs - s gs + s
            del gs, s
            dg = ga.mul_(u).mul_(ds)                                             # in place: ga is spent
            del ds
        gx = _gemm(mm, dg, wg.t()).add_(_gemm(mm, du, wu.t())) if ctx.needs_input_grad[0] else None   # [M, H]
        gwg = SwiGLUFn._weight_grad(ctx, 1, dg, x)                               # [I, H] = dg^T x
        gwu = SwiGLUFn._weight_grad(ctx, 2, du, x)                               # [I, H] = du^T x
        return gx, gwg, gwu, gwd, None, None


def _lean_on(x: torch.Tensor, *params: torch.Tensor) -> bool:
    """The lean path applies: autograd records this call, no autocast, one dtype for input and weights."""
    return (torch.is_grad_enabled() and active_dtype(x.device) is None
            and (x.requires_grad or any(p.requires_grad for p in params))
            and all(p.dtype == x.dtype for p in params) and x.numel() > 0)


def _norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    if _lean_on(hidden_states, self.weight):
        return RMSNormFn.apply(hidden_states, self.weight, self.variance_epsilon)
    return type(self).forward(self, hidden_states)


def _mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    projections = (self.gate_proj, self.up_proj, self.down_proj)
    weights = [p.weight for p in projections]
    if not _lean_on(x, *weights):
        return type(self).forward(self, x)
    x2 = x.reshape(-1, x.shape[-1])
    gemm = layer_gemm(projections[0])                    # the projections' own GEMMs, when all three share them
    if gemm is not None and (any(layer_gemm(p) is not gemm for p in projections) or not gemm.serves(x2, weights[0])):
        gemm = None
    into = all(grad_into(p) and p.weight.is_leaf for p in projections)
    out = SwiGLUFn.apply(x2.contiguous() if gemm is not None else x2, *weights, gemm, into)
    return out.view(*x.shape[:-1], out.shape[-1])


def is_swiglu(module: torch.nn.Module) -> bool:
    """A gate/up/down MLP of bias-free plain linear layers (grpo.modeling.hooks.plain_linear) with a SiLU."""
    projections = [getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    return (all(p is not None and plain_linear(p) and p.bias is None for p in projections)
            and type(getattr(module, "act_fn", None)).__name__ in ("SiLU", "SiLUActivation"))


def use_lean_layers(model: torch.nn.Module, enabled: bool = True) -> int:
    """Route the RMSNorms (classes in :data:`RMS_NORMS`) and SwiGLU MLPs of `model` through the lean
    functions (`enabled`), or back to their stock forward. Returns how many modules were switched.
    Instance-level: parameters, state dict and module types are unchanged."""
    count = 0
    for module in model.modules():
        lean = None
        if type(module).__name__ in RMS_NORMS and hasattr(module, "variance_epsilon"):
            lean = _norm_forward
        elif is_swiglu(module):
            lean = _mlp_forward
        if lean is None:
            continue
        if enabled:
            module.forward = types.MethodType(lean, module)
            count += 1
        elif "forward" in vars(module):
            del module.forward
            count += 1
    return count


def lean_mlps(model: torch.nn.Module) -> int:
    """How many of `model`'s MLPs run the lean function (0: none, or `train.lean_layers` off)."""
    return sum(vars(m).get("forward") is not None and getattr(vars(m)["forward"], "__func__", None) is _mlp_forward
               for m in model.modules())
