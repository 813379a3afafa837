"""A distributed sampler that is re-seeded per epoch and can resume in the middle of one."""

from __future__ import annotations

from collections.abc import Iterator

import torch


class ResumableSampler(torch.utils.data.Sampler[int]):
    """Yields this rank's share of a (shuffled) epoch, optionally skipping its first samples.

    Every rank draws the same permutation (seed + epoch), trims it to a multiple of the number of
    replicas so ranks see equal counts, and takes every `num_replicas`-th index from `rank`.
    With one replica and a global batch of `num_replicas * b`, the samples of a step are the same
    set as with `num_replicas` ranks of batch `b`, which the equivalence tests rely on.

    Args:
        num_samples: Dataset length.
        num_replicas: Number of data-parallel ranks.
        rank: This rank.
        shuffle: Permute each epoch.
        seed: Base seed; epoch `e` uses `seed + e`.
    """

    def __init__(self, num_samples: int, num_replicas: int = 1, rank: int = 0, shuffle: bool = True,
                 seed: int = 0) -> None:
        self.num_samples = num_samples
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation and forget any skip from a previous epoch."""
        self.epoch = epoch
        self.start = 0

    def skip(self, num_samples: int) -> None:
        """Skip this rank's first `num_samples` of the current epoch (already seen before a resume)."""
        self.start = num_samples

    def _indices(self) -> list[int]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples, generator=generator).tolist()
        else:
            order = list(range(self.num_samples))
        usable = len(order) - len(order) % self.num_replicas
        return order[self.rank:usable:self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices()[self.start:])

    def __len__(self) -> int:
        return max(0, self.num_samples // self.num_replicas - self.start)
