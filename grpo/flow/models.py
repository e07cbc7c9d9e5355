"""Small conditional flow-matching models that train on CPU: v_theta(x_t, t, labels) ~ eps - x0.

* :class:`MLPFlow`: 2-D points (the Gaussian mixture of grpo/flow/mixture.py), one label field;
* :class:`TinyDiT`: C x H x W images (16 x 16 RGB for the shapes world) cut into p x p patches,
  a few transformer blocks with adaLN-zero conditioning (Peebles & Xie, 2023) on
  c = emb(t) + sum_k emb_k(label_k) (shape, colour, position).

Labels are long tensors [N, K]; label value `vocab[k]` (one past the field's last class) is the null
label of classifier-free guidance (`null_cond`). Every linear layer is :class:`RowLinear`, a batched
matmul per sample, so a sample's outputs do not depend on the batch it is computed in (CPU GEMMs of
different row counts differ in the last bits), and every activation is :func:`padded_act` (elementwise
kernels compute the tail of a tensor that fills no whole vector with scalar code, whose last bit can
differ: seen with AVX-512): the log-probs stored at rollout and those recomputed in the update then agree
exactly, whatever the micro-batch size.

`save_pretrained(dir)` writes config.json + model.safetensors (what the checkpoints of grpo/state/
expect); :func:`load_flow_model` reads them back.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn
import torch.nn.functional as F


class RowLinear(nn.Linear):
    """nn.Linear computed as one GEMM per sample (torch.bmm over the batch dim), batch-invariant.

    Shape: [N, ..., in] -> [N, ..., out]
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x3 = x.reshape(x.shape[0], -1, x.shape[-1])                            # [N, R, in]
        y = torch.bmm(x3, self.weight.t().expand(x3.shape[0], -1, -1)) + self.bias
        return y.reshape(*lead, -1)


#: Elements per block :func:`padded_act` pads to: a multiple of two vectors of every CPU ISA (AVX-512: 2 x 16).
ACT_BLOCK = 64


def padded_act(fn, x: torch.Tensor) -> torch.Tensor:
    """fn(x) for an elementwise `fn`, computed on `x` flattened and zero-padded to a multiple of :data:`ACT_BLOCK`
    elements, so every element goes through the vectorised kernel, never the scalar tail loop; where an element
    sits in the batch then cannot change its value.  Shape: any -> same"""
    flat = x.reshape(-1)
    pad = -flat.numel() % ACT_BLOCK
    return fn(F.pad(flat, (0, pad)) if pad else flat)[:flat.numel()].view(x.shape)


class PaddedAct(nn.Module):
    """An activation module computed by :func:`padded_act` (no parameters: state dicts are unchanged)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return padded_act(self.fn, x)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of t in [0, 1] (scaled by 1000 as in DiT).   Shape: [N] -> [N, dim]"""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = 1000.0 * t.float()[:, None] * freqs[None]                            # [N, half]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class Conditioning(nn.Module):
    """c = MLP(emb(t)) + sum_k emb_k(label_k); each field has one extra (null) class for CFG."""

    def __init__(self, vocab: list[int], dim: int):
        super().__init__()
        self.vocab, self.dim = list(vocab), dim
        self.t_mlp = nn.Sequential(RowLinear(dim, dim), PaddedAct(F.silu), RowLinear(dim, dim))
        self.labels = nn.ModuleList(nn.Embedding(v + 1, dim) for v in vocab)

    def forward(self, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        c = self.t_mlp(time_embedding(t, self.dim))                            # [N, dim]
        for k, emb in enumerate(self.labels):
            c = c + emb(cond[:, k])
        return c


class FlowModel(nn.Module):
    """What the sampler, the loop and the checkpoints need of a flow model."""

    config: dict

    def null_cond(self, cond: torch.Tensor) -> torch.Tensor:
        """The null labels of CFG for a batch of labels.   Shape: [N, K] -> [N, K]"""
        return torch.tensor(self.cond.vocab, dtype=cond.dtype, device=cond.device).expand_as(cond)

    def save_pretrained(self, path: str | Path, **_: object) -> None:
        from safetensors.torch import save_model

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(self.config, indent=1))
        save_model(self, str(path / "model.safetensors"))


class MLPFlow(FlowModel):
    """v(x, t, label) for 2-D points: an MLP on [x, c].   Shape: x [N, 2] -> [N, 2]"""

    def __init__(self, vocab: list[int], dim: int = 128, depth: int = 3, data_dim: int = 2):
        super().__init__()
        self.config = {"model_type": "grpo-flow-mlp", "vocab": list(vocab), "dim": dim, "depth": depth,
                       "data_dim": data_dim}
        self.cond = Conditioning(vocab, dim)
        layers: list[nn.Module] = [RowLinear(data_dim + dim, dim), PaddedAct(F.silu)]
        for _ in range(depth - 1):
            layers += [RowLinear(dim, dim), PaddedAct(F.silu)]
        self.net = nn.Sequential(*layers, RowLinear(dim, data_dim))

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([x, self.cond(t, cond)], dim=-1))


class Block(nn.Module):
    """Pre-norm transformer block with adaLN-zero modulation (shift, scale, gate for attention and MLP)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.qkv, self.proj = RowLinear(dim, 3 * dim), RowLinear(dim, dim)
        self.mlp = nn.Sequential(RowLinear(dim, 4 * dim), PaddedAct(_gelu_tanh), RowLinear(4 * dim, dim))
        self.ada = RowLinear(dim, 6 * dim)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        n, tokens, dim = x.shape
        sh1, sc1, g1, sh2, sc2, g2 = self.ada(padded_act(F.silu, c)).unsqueeze(1).chunk(6, dim=-1)   # [N, 1, dim] each
        q, k, v = self.qkv(self.norm1(x) * (1 + sc1) + sh1).view(n, tokens, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, tokens, dim)
        x = x + g1 * self.proj(a)
        return x + g2 * self.mlp(self.norm2(x) * (1 + sc2) + sh2)


class TinyDiT(FlowModel):
    """A small DiT for C x H x W images.   Shape: x [N, C, H, W], t [N], cond [N, K] -> v [N, C, H, W]"""

    def __init__(self, vocab: list[int], image_size: int = 16, channels: int = 3, patch: int = 2, dim: int = 64,
                 depth: int = 4, heads: int = 4):
        super().__init__()
        if image_size % patch:
            raise ValueError(f"TinyDiT: image_size {image_size} is not a multiple of patch {patch}")
        self.config = {"model_type": "grpo-flow-dit", "vocab": list(vocab), "image_size": image_size,
                       "channels": channels, "patch": patch, "dim": dim, "depth": depth, "heads": heads}
        self.grid, self.patch, self.channels = image_size // patch, patch, channels
        self.cond = Conditioning(vocab, dim)
        self.embed = RowLinear(channels * patch * patch, dim)
        self.pos = nn.Parameter(torch.randn(1, self.grid ** 2, dim, device=self.embed.weight.device) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ada = RowLinear(dim, 2 * dim)
        self.out = RowLinear(dim, channels * patch * patch)
        for layer in (self.ada, self.out):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """[N, C, H, W] -> [N, T, C p p]"""
        n, p, g = x.shape[0], self.patch, self.grid
        return x.reshape(n, self.channels, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(n, g * g, -1)

    def unpatchify(self, y: torch.Tensor) -> torch.Tensor:
        """[N, T, C p p] -> [N, C, H, W]"""
        n, p, g = y.shape[0], self.patch, self.grid
        return y.reshape(n, g, g, self.channels, p, p).permute(0, 3, 1, 4, 2, 5).reshape(n, self.channels, g * p, g * p)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        c = self.cond(t, cond)                                                 # [N, dim]
        h = self.embed(self.patchify(x)) + self.pos                            # [N, T, dim]
        for block in self.blocks:
            h = block(h, c)
        shift, scale = self.ada(padded_act(F.silu, c)).unsqueeze(1).chunk(2, dim=-1)
        return self.unpatchify(self.out(self.norm(h) * (1 + scale) + shift))


MODEL_TYPES: dict[str, type] = {"grpo-flow-mlp": MLPFlow, "grpo-flow-dit": TinyDiT}


def build_flow_model(config: dict) -> FlowModel:
    """A model from its config dict (`model_type` picks the class)."""
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    if config.get("model_type") not in MODEL_TYPES:
        raise ValueError(f"flow model config: model_type must be one of {sorted(MODEL_TYPES)}, got "
                         f"{config.get('model_type')!r}")
    return MODEL_TYPES[config["model_type"]](**kwargs)


def load_flow_model(path: str | Path, device: torch.device | str = "cpu") -> FlowModel:
    """A model saved by `save_pretrained` (config.json + model.safetensors), on `device`."""
    from safetensors.torch import load_model

    path = Path(path)
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"{path}: not a flow model directory (needs config.json and model.safetensors)")
    with torch.device(device):
        model = build_flow_model(json.loads((path / "config.json").read_text()))
    load_model(model, str(path / "model.safetensors"), device=str(device))
    return model
