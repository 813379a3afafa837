"""Less activation memory for Llama-family models: the SwiGLU MLP and RMSNorm keep fewer tensors for backward.

Autograd keeps every intermediate of Hugging Face's MLP, `down(silu(gate(x)) * up(x))`: gate, up,
silu(gate) and their product, four tensors of the MLP's width per token and layer. The MLP here keeps
gate and up only and recomputes the two elementwise products in backward. RMSNorm keeps its input
and one scalar per token instead of its fp32 input copy and the normalised tensor. In this repository's
benchmark model that is about a third of the saved activations of a step (measured,
benchmarks/README.md). Under bf16 autocast the share should be larger, since RMSNorm's fp32 copies
are twice the size of the bf16 activations around them; that has not been measured on a GPU.

The forward computes exactly what Hugging Face's does, op for op, so a forward (sampling, reference
log-probs, evaluation) is bitwise the same. Backward differs only by rounding, in the order of 1e-8
on fp32 gradients; its extra cost is two elementwise passes over the MLP's width per layer, noise on
the benchmark's CPU steps.

An MLP whose projections are not plain bias-free `nn.Linear` (a LoRA adapter, quantized weights) or
whose activation is not SiLU keeps Hugging Face's forward, checked at every call.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Classes whose forward is Llama's, formula for formula (transformers copies it between them). Gemma's
# RMSNorm scales by (1 + weight) and is not among them.
SWIGLU_MLPS = frozenset({"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP"})
RMS_NORMS = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"})


class _Autocast:
    """The autocast state of a forward, re-entered in its backward (which autograd runs without it)."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.enabled = torch.is_autocast_enabled(device_type)
        self.dtype = torch.get_autocast_dtype(device_type)

    def __call__(self) -> torch.autocast:
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)


class SwiGLU(torch.autograd.Function):
    """`down(silu(x @ gate.T) * (x @ up.T))`, keeping x, gate(x) and up(x) for backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, gate_weight: Tensor, up_weight: Tensor, down_weight: Tensor) -> Tensor:
        gate = F.linear(x, gate_weight)
        up = F.linear(x, up_weight)
        ctx.save_for_backward(x, gate, up, gate_weight, up_weight, down_weight)
        ctx.autocast = _Autocast(x.device.type)
        return F.linear(F.silu(gate) * up, down_weight)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        x, gate, up, gate_weight, up_weight, down_weight = ctx.saved_tensors
        flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731  (tokens, features)
        with ctx.autocast():  # in place where a tensor is done with: a backward's peak is at its widest point
            activated = F.silu(gate)  # recomputed, not kept
            grad_down = flat(grad_out).t() @ flat(activated * up)
            grad_product = grad_out @ down_weight
            grad_up = grad_product.mul(activated)
            del activated
            grad_gate = torch.ops.aten.silu_backward(grad_product.mul_(up), gate)
            del grad_product
            grad_x = grad_gate @ gate_weight
            grad_x += grad_up @ up_weight
            grad_gate_weight = flat(grad_gate).t() @ flat(x)
            del grad_gate
            grad_up_weight = flat(grad_up).t() @ flat(x)
        return grad_x, grad_gate_weight, grad_up_weight, grad_down  # autograd casts each to its input's dtype


class RMSNorm(torch.autograd.Function):
    """`weight * (x * rsqrt(mean(x^2) + eps))` in fp32, cast back to x's dtype before the weight (as Llama's)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        wide = x.to(torch.float32)
        inverse_rms = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, inverse_rms)
        return weight * (wide * inverse_rms).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, Tensor, None]:
        x, weight, inverse_rms = ctx.saved_tensors
        normed = (x.to(torch.float32) * inverse_rms)
        grad_weight = (grad_out * normed.to(x.dtype)).reshape(-1, weight.shape[-1]).sum(0)
        grad_normed = (grad_out * weight).to(x.dtype).to(torch.float32)
        # d/dx of x * (mean(x^2) + eps)^-1/2, in terms of the normalised x
        grad_x = inverse_rms * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight, None


def _lean_mlp_forward(self: nn.Module, x: Tensor) -> Tensor:
    projections = (self.gate_proj, self.up_proj, self.down_proj)
    if all(type(p) is nn.Linear and p.bias is None for p in projections) and _is_silu(self.act_fn):
        return SwiGLU.apply(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)
    return type(self).forward(self, x)  # Hugging Face's


def _lean_norm_forward(self: nn.Module, hidden_states: Tensor) -> Tensor:
    return RMSNorm.apply(hidden_states, self.weight, self.variance_epsilon)


def _is_silu(activation: nn.Module) -> bool:
    return isinstance(activation, nn.SiLU) or type(activation).__name__ == "SiLUActivation"


def use_lean_activations(model: nn.Module) -> int:
    """Give `model`'s Llama-family MLPs and RMSNorms the leaner backward; returns how many modules changed.

    The forward is replaced on each instance (not on the class), so other models in the process keep
    Hugging Face's; copies made with `copy.deepcopy` keep the replacement, bound to the copy.
    """
    changed = 0
    for module in model.modules():
        name = type(module).__name__
        if name in SWIGLU_MLPS:
            module.forward = types.MethodType(_lean_mlp_forward, module)
        elif name in RMS_NORMS:
            module.forward = types.MethodType(_lean_norm_forward, module)
        else:
            continue
        changed += 1
    return changed
