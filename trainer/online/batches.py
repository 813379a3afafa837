"""An episode's minibatch on its way to the update step: moved to the device (pinned first when asked)
and cut into micro-batches. Shared by the colocated loop and the asynchronous engine's actor."""

from __future__ import annotations

from dataclasses import replace

import torch

from trainer.rollout.experience import Experience


def to_device(experience: Experience, device: torch.device, pin_memory: bool = False) -> Experience:
    """`experience` on `device`; CPU tensors bound for CUDA are pinned first when `pin_memory`, then
    copied without blocking (what the seed's `dataloader_pin_memory` asks of its DataLoader)."""
    if not (pin_memory and device.type == "cuda"):
        return experience.to(device)
    moved = {name: (tensor.pin_memory() if tensor.device.type == "cpu" else tensor).to(device, non_blocking=True)
             for name, tensor in experience.as_batch().items()}
    return replace(experience, **moved)


def micro_batches(minibatch: Experience, micro_batch_size: int, device: torch.device,
                  ptx: dict[str, torch.Tensor] | None = None, pin_memory: bool = False) -> list[dict]:
    """The micro-batches of one optimizer step, on `device`; each carries the ptx batch when given."""
    batches = [m.as_batch() for m in to_device(minibatch, device, pin_memory).split(micro_batch_size)]
    if ptx is not None:
        for batch in batches:
            batch.update(ptx_input_ids=ptx["input_ids"].to(device), ptx_labels=ptx["labels"].to(device))
    return batches
