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
:class:`grpo.modeling.cpu_kernels.DnnLinear`, whose GEMMs it keeps) with a SiLU activation. Anything else
(LoRA adapters, ``train.precision`` bf16 / fp16, no-grad rollouts and reference passes) runs the stock
forward. Device-agnostic: pure torch operations on the input's device.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from grpo.modeling import native_elementwise
from grpo.modeling.cpu_kernels import PLAIN_LINEARS, DnnLinear, _dnn, _eligible, add_weight_grad_
from grpo.modeling.grad_in_place import GradIntoLinear, accumulate_grad

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
        if native_elementwise.applies(x, weight):                                # one pass (train.elementwise_kernel)
            y, r = native_elementwise.rms_norm_forward(x, weight, eps)
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
        if native_elementwise.applies(gy, x, weight):
            gx, gw = native_elementwise.rms_norm_backward(gy, x, weight, r, *ctx.needs_input_grad[:2])
            return gx, gw, None
        h = x.float() * r                                                        # [..., H]
        gx = gw = None
        if ctx.needs_input_grad[1]:
            gw = (gy * h.to(x.dtype)).reshape(-1, h.shape[-1]).sum(0).to(weight.dtype)    # [H]
        if ctx.needs_input_grad[0]:
            gh = (gy * weight).float()
            gx = (r * (gh - h * (gh * h).mean(-1, keepdim=True))).to(x.dtype)            # [..., H]
        return gx, gw, None


def _gemm(onednn: bool, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a b^T, by oneDNN when the layer was switched to it (`model.cpu_matmul`). Shape: a [M, K], b [N, K] -> [M, N]"""
    return _dnn(a, b) if onednn else a @ b.t()


class SwiGLUFn(torch.autograd.Function):
    """The gated MLP of Llama-style models (Shazeer 2020, arXiv 2002.05202):
    y = (silu(x Wg^T) * (x Wu^T)) Wd^T, saving x, g = x Wg^T and u = x Wu^T only. Backward, with
    s = sigmoid(g), a = g s u and ga = gy Wd: dWd = gy^T a, du = ga g s, dg = ga u s (1 + g (1 - s)),
    dx = dg Wg + du Wu, dWg = dg^T x, dWu = du^T x.

    `into`: the weight gradients are accumulated into ``.grad`` in place (the projections are
    :class:`grpo.modeling.cpu_kernels.GradIntoLinear`, or oneDNN's DnnLinear with ``grad_into``, whose whole product
    becomes ``.grad`` or is added to it), autograd receives None for them. Returned to autograd instead, the oneDNN
    products raised the update's peak RSS by ~200 MiB on a 100.7M model at 32 new tokens (bench shapes, Zen 5).

    Shape: x [M, H], Wg / Wu [I, H], Wd [H, I] -> [M, H]
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, wd: torch.Tensor, onednn: bool,
                into: bool = False):
        g, u = _gemm(onednn, x, wg), _gemm(onednn, x, wu)                        # [M, I]
        ctx.save_for_backward(x, g, u, wg, wu, wd)
        ctx.onednn, ctx.into = onednn, into
        ctx.params = (wg, wu, wd) if into else None  # the leaves themselves: saved tensors may come back as aliases
        a = native_elementwise.swiglu_forward(g, u) if native_elementwise.applies(g, u) else F.silu(g).mul_(u)
        return _gemm(onednn, a, wd)                                              # [M, H]

    @staticmethod
    def _weight_grad(ctx, i: int, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
        """a^T b, the gradient of weight input `i`: returned, or (`into`) added to that parameter's .grad.

        Shape: a [M, N], b [M, K] -> [N, K]
        """
        if not ctx.needs_input_grad[i]:
            return None
        if ctx.into and ctx.onednn:    # the native kernel, or oneDNN's whole product made .grad or added to it
            add_weight_grad_(ctx.params[i - 1], a, b, whole=True)
            return None
        if ctx.into:
            accumulate_grad(ctx.params[i - 1], a.t(), b)
            return None
        return _gemm(ctx.onednn, a.t(), b.t())

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        x, g, u, wg, wu, wd = ctx.saved_tensors
        mm = ctx.onednn
        gy = gy.contiguous()
        ga = _gemm(mm, gy, wd.t())                                               # [M, I] = gy Wd
        if native_elementwise.applies(g, u, ga):                                 # one pass (train.elementwise_kernel)
            dg, du, a = native_elementwise.swiglu_backward_(g, u, ga)
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
    return (torch.is_grad_enabled() and not torch.is_autocast_enabled(x.device.type)
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
    onednn = all(type(p) is DnnLinear for p in projections) and _eligible(x2, weights[0])
    into = all((type(p) is GradIntoLinear or (type(p) is DnnLinear and p.grad_into)) and p.weight.is_leaf
               for p in projections)
    out = SwiGLUFn.apply(x2.contiguous() if onednn else x2, *weights, onednn, into)
    return out.view(*x.shape[:-1], out.shape[-1])


def _is_swiglu(module: torch.nn.Module) -> bool:
    projections = [getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    return (all(type(p) in PLAIN_LINEARS and p.bias is None for p in projections)
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
        elif _is_swiglu(module):
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


def onednn_mlps(model: torch.nn.Module) -> bool:
    """Whether `model` has SwiGLU MLPs whose three projections all run through oneDNN (`model.cpu_matmul` switched
    them to DnnLinear): where `train.lean_layers` empty (auto) turns the lean layers on."""
    return any(_is_swiglu(m) and all(type(getattr(m, n)) is DnnLinear for n in ("gate_proj", "up_proj", "down_proj"))
               for m in model.modules())


def resolve_lean_layers(setting: bool | None, model: torch.nn.Module, world_size: int = 1) -> bool:
    """`train.lean_layers`: true / false as set; None (auto) = on in one process when :func:`onednn_mlps`. Measured on
    an AMD EPYC Zen 5 (docs/performance.md): the update's forward+backward 5-7 % faster with lean layers at hidden
    768-1024 (oneDNN products), 2-4 % slower at hidden 128-256; on hosts whose products are MKL's it was neutral."""
    if setting is not None:
        return bool(setting)
    return world_size == 1 and onednn_mlps(model)
