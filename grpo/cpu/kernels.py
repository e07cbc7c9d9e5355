"""float32 linear layers on CPU through oneDNN (`cpu.cpu_matmul`).

PyTorch's CPU `aten::mm` for float32 calls MKL, which on AMD processors runs its AVX2 kernels; the
oneDNN matmul that ships inside the same PyTorch uses AVX-512 there and, measured on this project's
2-core AMD EPYC machine (bench/speed.py), runs the GEMMs of a 100M model 2.2x (training shapes) to
3x (16-row decode) faster, with float32 accuracy (same order of error against float64 as MKL).

grpo.cpu.placement.use_cpu_matmul switches every ``nn.Linear`` of a model (LoRA adapters and the tied LM head
included) to :class:`DnnLinear`, whose forward is :func:`linear`: y = x W^T + b through oneDNN,
with a backward that also runs through oneDNN (dX = dY W, dW = dY^T X, db = sum dY). Anything that
is not a float32 CPU tensor (CUDA, bfloat16, float64, DTensor shards), and every call under CPU
autocast (`train.precision` bf16 / fp16), takes ``F.linear`` unchanged, so a switched model stays
device-agnostic and autocast sees every product. ``auto`` switches only models at least
grpo.cpu.placement.AUTO_MIN_WIDTH wide, and only when a short calibration on this machine shows oneDNN
>= 1.25x faster than ``aten::mm``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from grpo.cpu import native_gemm
from grpo.cpu.grad_in_place import GradIntoLinear
from grpo.cpu.workspace import held
from grpo.modeling.in_place import InputCasts, accumulate_grad, cast_linear


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T (+ b) by oneDNN.  Shape: x [M, K], weight [N, K], bias [N] -> [M, N]"""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def padded_rows(m: int) -> int:
    """`m` rounded up to a multiple of max(16, 2^(bits(m) - 4)): at most 8 row counts per octave,
    at most 1/8 extra rows (and 15 below 256). oneDNN generates and caches a kernel per GEMM shape
    (~0.2 MiB each); without rounding, a rollout whose rows leave one by one, or micro-batches of
    new lengths every step, bring new shapes all the time (measured: +110 MiB RSS on the embedded
    model)."""
    step = max(16, 1 << max(m.bit_length() - 4, 0))
    return -(-m // step) * step


#: Largest padded operand (bytes) :func:`pad_rows` keeps a buffer for; bigger ones are new tensors.
PAD_WORKSPACE_BYTES = 16 * 2 ** 20


def pad_rows(x: torch.Tensor, rows: int, slot: str = "x") -> torch.Tensor:
    """`x` with zero rows appended up to `rows` rows, in a reused buffer of this thread (one per `slot`,
    grpo.cpu.workspace): valid until the next call with the same slot, for an operand read at once and dropped. ``F.pad`` makes a new tensor
    per call and zero-fills all of it: at `cpu.mmap_threshold_mb` 1 every operand of >= 1 MiB was fresh pages
    from the kernel (qwen2 768-wide update: ~10 % of its time in ``constant_pad_nd``). Operands over
    :data:`PAD_WORKSPACE_BYTES`, or not on the CPU, still go through ``F.pad``.

    Shape: x [M, K] -> [rows, K], rows >= M
    """
    m, k = x.shape
    if rows == m:
        return x
    if x.device.type != "cpu" or rows * k * x.element_size() > PAD_WORKSPACE_BYTES:
        return F.pad(x, (0, 0, 0, rows - m))
    out = held(f"pad.{slot}", x, (rows, k))
    out[:m].copy_(x)
    out[m:].zero_()
    return out


def onednn_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`onednn_linear` with the rows of `x` zero-padded to :func:`padded_rows` (result trimmed back).

    Shape: x [M, K], weight [N, K], bias [N] -> [M, N]
    """
    rows = x.shape[0]
    return onednn_linear(pad_rows(x, padded_rows(rows)), weight, bias)[:rows]


#: Bytes of one block product of :func:`add_product_`: under glibc's mmap threshold (`cpu.mmap_threshold_mb`,
#: default 1 MiB), so each block's output is heap memory, not fresh pages from the kernel. Measured on the
#: AVX-512 host, dW of a [151936, 768] LM head from 55-256 rows: 2048-row blocks (6 MiB each) ran at 80-180
#: GFLOP/s, 256-row ones (768 KiB) at 230-370, MKL's ``addmm_`` into place at 220.
BLOCK_BYTES = 768 * 1024


def block_size(n: int, width: int) -> int:
    """Columns (or rows) per block product whose [n, block] float32 output stays within :data:`BLOCK_BYTES`: a
    multiple of 64, at least 64, at most `width`."""
    return min(width, max(64, BLOCK_BYTES // (4 * max(n, 1)) // 64 * 64))


def native_grads(target: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether target += a^T b goes to the native kernel (`cpu.grad_kernel`): all three are contiguous float32 CPU
    tensors (tested first: another device never builds or loads the library) and the kernel is active."""
    return all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() and type(t) is torch.Tensor
               for t in (target, a, b)) and native_gemm.active("grad")


def add_product_(target: torch.Tensor, a: torch.Tensor, b: torch.Tensor, rows: int | None = None) -> torch.Tensor:
    """target += a^T b in place: by the native kernel (`cpu.grad_kernel`, :func:`native_grads`: both operands
    read where they are), else through oneDNN, :func:`block_size` rows of `target` at a time (oneDNN has no
    ``out=``: a whole [N, K] product would be a new tensor of the target's size per call). `rows`: the first rows
    of a and b that are not zero padding (the native kernel skips the rest).

    Shape: target [N, K], a [M, N], b [M, K] (rows of any stride; contiguous ones are read in place) -> target
    """
    if native_grads(target, a, b):
        return native_gemm.grad_accumulate(target, a[:rows], b[:rows])
    rows, bt = block_size(target.shape[1], target.shape[0]), b.t()
    for v in range(0, target.shape[0], rows):
        target[v:v + rows].add_(onednn_linear(a[:, v:v + rows].t(), bt))           # [rows, K] = a_v^T b
    return target


def add_weight_grad_(param: torch.Tensor, a: torch.Tensor, b: torch.Tensor, rows: int | None = None,
                     whole: bool = False) -> None:
    """param.grad += a^T b in place (`cpu.grad_in_place` for oneDNN-switched layers). The native kernel
    (`cpu.grad_kernel`, :func:`native_grads`) adds into ``.grad``, or stores the first product into a new one
    (the sums adding to zeros would give, without the zero fill). Through oneDNN the first product becomes ``.grad``
    (no zero fill, no add pass) and later ones are added: in blocks (:func:`add_product_`), or as one whole product
    (`whole`, the lean SwiGLU's). `rows`: the first rows of a and b that are not zero padding.

    Shape: param [N, K], a [M, N], b [M, K]
    """
    if native_grads(param.data if param.grad is None else param.grad, a, b):
        if param.grad is None:
            grad = torch.empty(param.shape, dtype=param.dtype, device=param.device)
            param.grad = native_gemm.grad_accumulate(grad, a[:rows], b[:rows], overwrite=True)
        else:
            add_product_(param.grad, a, b, rows)                             # native
    elif param.grad is None:
        param.grad = onednn_linear(a.t(), b.t())
    elif whole:
        param.grad.add_(onednn_linear(a.t(), b.t()))
    else:
        add_product_(param.grad, a, b)


class _DnnLinearFn(torch.autograd.Function):
    """y = x W^T + b with every GEMM (forward and both gradients) through oneDNN. With `into`
    (`cpu.grad_in_place`, leaf parameters) dW and db go into ``.grad`` in place and autograd receives None for
    them, as grpo.cpu.grad_in_place's layers: the first micro-batch's dW becomes ``.grad`` (unless a
    gradient buffer, `cpu.grad_buffer`, made it already), later ones are added by :func:`add_product_`.
    Autograd's dW would be a new tensor of the weight's size per micro-batch, then one more pass to add it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                into: bool = False) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).contiguous()                        # [M, K]
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        ctx.into = (weight, bias) if into else None         # the leaves on ctx, not saved (as grad_in_place's)
        return onednn_rows(x2, weight, bias).view(*x.shape[:-1], weight.shape[0])  # [..., N]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x2, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1]).contiguous()                   # [M, N]
        gx = gw = gb = None   # oneDNN reads transposes of contiguous tensors in place (others hit a slow path)
        rows = g2.shape[0]
        pad = padded_rows(rows) - rows                                       # zero rows add nothing to dY^T X
        gp = pad_rows(g2, rows + pad, "g")                                  # [M', N], padded once for both
        if ctx.needs_input_grad[0]:
            gx = onednn_linear(gp, weight.t())[:rows].view(*grad.shape[:-1], weight.shape[1])   # [..., K] = dY W
        if ctx.needs_input_grad[1]:
            xp = pad_rows(x2, rows + pad)                                    # [M', K]
            if ctx.into is None:
                gw = onednn_linear(gp.t(), xp.t())                                    # [N, K] = dY^T X
            else:
                add_weight_grad_(ctx.into[0], gp, xp, rows)                  # .grad += dY^T X
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(dim=0)                                               # [N]
            if ctx.into is not None:
                accumulate_grad(ctx.into[1], gb)
                gb = None
        return gx, gw, gb, None


def prepack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """A copy of `weight` in oneDNN's own blocked layout for products of about `rows` rows (no autograd).

    :func:`linear` takes it in place of the weight. oneDNN otherwise reorders the weight into that layout
    at every call: at 16 rows (a decode step) this is most of the product's cost. Measured on the
    2-core AMD EPYC (AVX2), 16 rows x 768 x 2048 and x 32,768: 59-64 GFLOP/s plain, 71-81 prepacked
    (MKL: 33-52). On the AVX-512 BF16 host, bfloat16 weights (`train.precision` bf16: the weight cast first)
    at 16 rows: 1.4-2.4x the speed of autocast's ``F.linear``, same values. Products of any row count stay
    exact. For a rollout only: the weights change after it.

    float32 weights for at most ``native_gemm.MAX_ROWS`` rows go to the native decode kernel instead where it is
    active (`cpu.decode_kernel`, grpo/cpu/native_gemm.py): a ``native_gemm.PanelWeight``.

    Shape: weight [N, K] float32 or bfloat16 on the CPU -> [N, K] (``torch._mkldnn`` layout, same dtype),
    or a PanelWeight of [N, K]
    """
    if weight.dtype == torch.float32 and padded_rows(rows) <= native_gemm.MAX_ROWS and native_gemm.active():
        return native_gemm.pack(weight)                                     # `cpu.decode_kernel`
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), padded_rows(rows))


def can_prepack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether :func:`prepack` applies to products computed in `dtype` on `device`: the CPU with oneDNN, in
    float32, or in bfloat16 where oneDNN has native bfloat16 kernels (AVX-512 BF16 / AMX; on other CPUs they
    are emulated and the weights keep autocast's path). float16 and other devices never."""
    if device.type != "cpu" or not onednn_works():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and bf16_native())


@functools.lru_cache(maxsize=None)
def bf16_native() -> bool:
    """oneDNN runs bfloat16 GEMMs natively on this CPU (AVX-512 BF16 or AMX), not emulated."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check is not None and check())


def onednn_eligible(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """float32 plain tensors on the CPU (not CUDA, not a DTensor shard, not another dtype), outside CPU
    autocast: ``torch.ops.mkldnn`` is below autocast's dispatch, so under ``train.precision`` bf16 / fp16
    the product must go through ``F.linear``, which autocast casts (its bfloat16 GEMM is oneDNN's too)."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and type(weight) in (torch.Tensor, torch.nn.Parameter) and x.shape[-1] > 0 and x.numel() > 0
            and not torch.is_autocast_enabled("cpu"))


def padded_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` with the rows of `x` zero-padded to :func:`padded_rows` (result trimmed back): the
    CPU autocast path without autograd (rollouts, reference passes), whose bfloat16 GEMM is oneDNN's
    too and also builds a kernel per shape. Not under autograd: there the padded copy of `x` would be
    saved for the backward pass (measured on qwen2-100m's update: +120 MiB and 5 % slower).

    Shape: x [..., K], weight [N, K], bias [N] -> [..., N]
    """
    x2 = x.reshape(-1, x.shape[-1])                                         # [M, K]
    rows = x2.shape[0]
    pad = padded_rows(rows) - rows
    out = F.linear(pad_rows(x2, rows + pad), weight, bias)                 # [M', N]
    return out[:rows].view(*x.shape[:-1], weight.shape[0])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, into: bool = False) -> torch.Tensor:
    """``F.linear`` through oneDNN where eligible (float32 on CPU), :func:`padded_linear` under CPU
    autocast without autograd, else ``F.linear`` itself. A :func:`prepack`-ed weight (no autograd) always
    goes to oneDNN, `x` and `bias` cast to its dtype as autocast would cast them. `into`: leaf parameters'
    gradients go into ``.grad`` in place (:class:`_DnnLinearFn`).

    Shape: x [..., K], weight [N, K], bias [N] -> [..., N]
    """
    if type(weight) is native_gemm.PanelWeight:                             # a rollout's native-packed copy
        return native_gemm.matmul(x, weight, bias)
    if weight.is_mkldnn:                                                    # a rollout's packed copy
        x2 = x.reshape(-1, x.shape[-1]).to(weight.dtype)
        out = onednn_rows(x2, weight, bias if bias is None else bias.to(weight.dtype))
        return out.view(*x.shape[:-1], weight.shape[0])
    if not onednn_eligible(x, weight):
        lowp_inference = torch.is_autocast_enabled("cpu") and not torch.is_grad_enabled()
        if lowp_inference and x.device.type == "cpu" and x.numel() > 0:
            return padded_linear(x, weight, bias)
        return F.linear(x, weight, bias)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)):
        into = into and weight.is_leaf and (bias is None or bias.is_leaf)
        return _DnnLinearFn.apply(x, weight, bias, into)
    out = onednn_rows(x.reshape(-1, x.shape[-1]), weight, bias)               # no graph: skip autograd.Function
    return out.view(*x.shape[:-1], weight.shape[0])


class DnnLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose forward is :func:`linear` (same parameters, state dict and isinstance).

    ``cast_weight`` (set for the update by :func:`grpo.modeling.precision.cast_trainable_linears`): the weight in autocast's
    dtype, made once per update; under autocast with autograd the product uses it (:class:`_ReusedCast`), and
    its input is cast through ``input_casts`` (:class:`InputCasts`, shared by the model's linears), so
    linears reading the same input save one low-precision copy of it between them.
    """

    cast_weight: torch.Tensor | None = None
    input_casts: InputCasts | None = None
    grad_into: bool = False                 # `cpu.grad_in_place`: weight and bias gradients go into .grad
    plain_linear = True                     # grpo.modeling.hooks.plain_linear: nn.Linear's math and parameters

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cast_weight is not None and torch.is_grad_enabled() and torch.is_autocast_enabled(x.device.type):
            return cast_linear(self, x, self.grad_into)
        return linear(x, self.weight, self.bias, self.grad_into)


@functools.lru_cache(maxsize=None)
def onednn_works() -> bool:
    """oneDNN's linear is present in this torch build and agrees with ``F.linear`` (float32)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    try:   # cached for the process: checked outside autocast, whose bfloat16 F.linear would fail the comparison
        g = torch.Generator(device="cpu").manual_seed(0)   # a CPU calibration, whatever the default device
        x, w, b = (torch.randn(5, 7, generator=g, device="cpu"), torch.randn(3, 7, generator=g, device="cpu"),
                   torch.randn(3, generator=g, device="cpu"))
        with torch.autocast("cpu", enabled=False):
            return bool(torch.allclose(onednn_linear(x, w, b), F.linear(x, w, b), atol=1e-5))
    except RuntimeError:
        return False


#: Module classes that are a plain ``nn.Linear`` but for how they multiply (the parameters are the same).
PLAIN_LINEARS = (torch.nn.Linear, DnnLinear, GradIntoLinear)




class OneDnnGemm:
    """:class:`DnnLinear`'s GEMMs for the model code's own products (grpo.modeling.hooks.LayerGemm, the class
    attribute ``DnnLinear.gemm``): the fused LM head's and the lean SwiGLU MLP's, through oneDNN (weight gradients
    through the native kernel where `cpu.grad_kernel` allows)."""

    serves = staticmethod(onednn_eligible)
    block_size = staticmethod(block_size)

    @staticmethod
    def mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """a b^T (+ bias).  Shape: a [M, K], b [N, K], bias [N] -> [M, N]"""
        return onednn_linear(a, b, bias)

    @staticmethod
    def add_product_(target: torch.Tensor, a: torch.Tensor, b: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        return add_product_(target, a, b, rows)

    @staticmethod
    def store_product_(target: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """target = a^T b: the native kernel writes it without a zero fill, else zeros plus :func:`add_product_`."""
        if native_grads(target, a, b):
            return native_gemm.grad_accumulate(target, a, b, overwrite=True)
        return add_product_(target.zero_(), a, b)

    @staticmethod
    def add_weight_grad_(param, a, b, rows: int | None = None, whole: bool = False) -> None:
        add_weight_grad_(param, a, b, rows, whole)


DnnLinear.gemm = OneDnnGemm()
