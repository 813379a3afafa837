"""A distributed sampler that is re-seeded per epoch, can resume in the middle of one, and can
batch samples of similar length together.

Length grouping cuts padding: on rows of 64-256 tokens, a random batch of 8 is padded to about 1.5x
its real tokens, a grouped one to almost none. It reorders within an epoch only; every sample is
still drawn exactly once per epoch, the order is a pure function of (seed, epoch), and resuming
skips into the same order. What it leaves out: lengths are taken as given (the collate function's
view of a sample), and the grouping window is fixed (`GROUP_WINDOW_BATCHES`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

GROUP_WINDOW_BATCHES = 64  # global batches per window that is sorted by length (HF's LengthGroupedSampler: 50)


class ResumableSampler(torch.utils.data.Sampler[int]):
    """Yields this rank's share of a (shuffled) epoch, optionally skipping its first samples.

    Every rank draws the same permutation (seed + epoch), trims it to a multiple of the number of
    replicas so ranks see equal counts, and takes every `num_replicas`-th index from `rank`.
    With one replica and a global batch of `num_replicas * b`, the samples of a step are the same
    set as with `num_replicas` ranks of batch `b`, which the equivalence tests rely on.

    With `lengths`, the epoch's order is grouped by length before it is split across ranks: the
    permutation is cut into windows of `GROUP_WINDOW_BATCHES` global batches (`batch_size *
    num_replicas` samples), each window is sorted longest first and cut into global batches, and
    the full batches are shuffled (the one holding the longest sample goes first, so a step that
    runs out of memory does so at once; a short last batch stays last). Rank `r` takes every
    `num_replicas`-th sample of each global batch, so the ranks' micro-batches of a step have
    similar lengths and together are that global batch. One process with batch `num_replicas * b`
    then takes the same steps as `num_replicas` ranks of batch `b` when the dataset size is a
    multiple of `num_replicas` (else the ranks drop samples the one process keeps, which shifts
    the windows).

    Args:
        num_samples: Dataset length.
        num_replicas: Number of data-parallel ranks.
        rank: This rank.
        shuffle: Permute each epoch.
        seed: Base seed; epoch `e` uses `seed + e`.
        lengths: Length of each sample (tokens after collation); None keeps the plain order.
        batch_size: Samples per rank per micro-batch; only used with `lengths`.
    """

    def __init__(self, num_samples: int, num_replicas: int = 1, rank: int = 0, shuffle: bool = True,
                 seed: int = 0, lengths: Sequence[int] | None = None, batch_size: int = 1) -> None:
        if lengths is not None and len(lengths) != num_samples:
            raise ValueError(f"lengths has {len(lengths)} entries for {num_samples} samples")
        self.num_samples = num_samples
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.lengths = list(lengths) if lengths is not None else None
        self.batch_size = batch_size
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
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        if self.shuffle:
            order = torch.randperm(self.num_samples, generator=generator).tolist()
        else:
            order = list(range(self.num_samples))
        usable = len(order) - len(order) % self.num_replicas
        if self.lengths is not None:
            order = self._group_by_length(order[:usable], generator)
        return order[self.rank:usable:self.num_replicas]

    def _group_by_length(self, order: list[int], generator: torch.Generator) -> list[int]:
        """`order` regrouped into global batches of similar length (see the class docstring)."""
        global_batch = self.batch_size * self.num_replicas
        window = global_batch * GROUP_WINDOW_BATCHES
        batches = []
        for start in range(0, len(order), window):
            # Longest first; ties keep the permutation's order, so the result depends on (seed, epoch) only.
            ranked = sorted(order[start:start + window], key=lambda index: -self.lengths[index])
            batches += [ranked[i:i + global_batch] for i in range(0, len(ranked), global_batch)]
        tail = [batches.pop()] if batches and len(batches[-1]) < global_batch else []
        if self.shuffle and batches:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
            longest = max(range(len(batches)), key=lambda i: self.lengths[batches[i][0]])
            batches.insert(0, batches.pop(longest))
        # Every batch holds a multiple of num_replicas samples, so rank r's stride lands on its share of each.
        return [index for batch in batches + tail for index in batch]

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices()[self.start:])

    def __len__(self) -> int:
        return max(0, self.num_samples // self.num_replicas - self.start)
