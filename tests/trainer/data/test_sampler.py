"""Tests of `ResumableSampler`: partitioning across ranks, per-epoch order, resuming mid-epoch."""

from __future__ import annotations

import pytest
import torch

from trainer.data.sampler import ResumableSampler

NUM_SAMPLES = 11  # odd, so two replicas must drop one sample
SEED = 7


def permutation(num_samples: int, seed: int, epoch: int) -> list[int]:
    """The epoch's shared order, computed the way the sampler documents it (seed + epoch)."""
    return torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def replicas(num_replicas: int, **kwargs) -> list[ResumableSampler]:
    return [ResumableSampler(NUM_SAMPLES, num_replicas, rank, seed=SEED, **kwargs) for rank in range(num_replicas)]


def test_two_replicas_partition_the_trimmed_epoch():
    rank0, rank1 = (list(sampler) for sampler in replicas(2))
    trimmed = permutation(NUM_SAMPLES, SEED, 0)[:NUM_SAMPLES - NUM_SAMPLES % 2]  # 10 of 11
    assert len(rank0) == len(rank1) == 5
    assert set(rank0).isdisjoint(rank1)
    assert sorted(rank0 + rank1) == sorted(trimmed)
    # Rank r takes every second index of the shared order, starting at r.
    assert rank0 == trimmed[0::2] and rank1 == trimmed[1::2]


@pytest.mark.parametrize("num_replicas", [1, 2, 3, 4])
def test_len_matches_what_each_replica_yields(num_replicas):
    for sampler in replicas(num_replicas):
        assert len(sampler) == len(list(sampler)) == NUM_SAMPLES // num_replicas


def test_without_shuffle_ranks_stride_the_natural_order():
    rank0, rank1 = (list(sampler) for sampler in replicas(2, shuffle=False))
    assert rank0 == [0, 2, 4, 6, 8]
    assert rank1 == [1, 3, 5, 7, 9]


def test_set_epoch_changes_the_order_reproducibly():
    sampler = ResumableSampler(NUM_SAMPLES, seed=SEED)
    epoch0 = list(sampler)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch1 != epoch0
    assert sorted(epoch1) == sorted(epoch0) == list(range(NUM_SAMPLES))
    assert epoch1 == permutation(NUM_SAMPLES, SEED, 1)

    other = ResumableSampler(NUM_SAMPLES, seed=SEED)  # a fresh process after a restart
    other.set_epoch(1)
    assert list(other) == epoch1
    other.set_epoch(0)
    assert list(other) == epoch0


def test_iterating_twice_in_one_epoch_gives_the_same_order():
    sampler = ResumableSampler(NUM_SAMPLES, seed=SEED)
    sampler.set_epoch(3)
    assert list(sampler) == list(sampler)


def test_different_seeds_give_different_orders():
    assert list(ResumableSampler(NUM_SAMPLES, seed=1)) != list(ResumableSampler(NUM_SAMPLES, seed=2))


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_skip_yields_exactly_the_remaining_tail_of_the_epoch(num_replicas):
    for sampler in replicas(num_replicas):
        sampler.set_epoch(2)
        full = list(sampler)
        sampler.skip(3)
        assert list(sampler) == full[3:]
        assert len(sampler) == len(full) - 3


def test_set_epoch_after_skip_resets_the_skip():
    sampler = ResumableSampler(NUM_SAMPLES, seed=SEED)
    sampler.set_epoch(0)
    sampler.skip(4)
    sampler.set_epoch(1)
    assert list(sampler) == permutation(NUM_SAMPLES, SEED, 1)
    assert len(sampler) == NUM_SAMPLES


def test_skipping_the_whole_epoch_yields_nothing():
    sampler = ResumableSampler(NUM_SAMPLES, seed=SEED)
    sampler.skip(NUM_SAMPLES + 5)
    assert list(sampler) == []
    assert len(sampler) == 0


@pytest.mark.parametrize("batch_size", [1, 2, 5])
@pytest.mark.parametrize("epoch", [0, 1])
def test_one_replica_first_2b_equals_two_ranks_first_b_each(batch_size, epoch):
    single = ResumableSampler(NUM_SAMPLES, 1, 0, seed=SEED)
    single.set_epoch(epoch)
    rank0, rank1 = replicas(2)
    rank0.set_epoch(epoch)
    rank1.set_epoch(epoch)
    b = batch_size
    assert sorted(list(single)[: 2 * b]) == sorted(list(rank0)[:b] + list(rank1)[:b])


def test_one_replica_steps_cover_the_same_sets_as_two_ranks_steps():
    # Step k of a single process with batch 2b holds the same samples as step k of two ranks with batch b.
    b = 2
    single = list(ResumableSampler(NUM_SAMPLES, 1, 0, seed=SEED))
    rank0, rank1 = (list(sampler) for sampler in replicas(2))
    for step in range(len(rank0) // b):
        expected = set(rank0[step * b:(step + 1) * b] + rank1[step * b:(step + 1) * b])
        assert set(single[step * 2 * b:(step + 1) * 2 * b]) == expected


# -- length grouping ----------------------------------------------------------------------------

LENGTHS = [(37 * i) % 101 + 1 for i in range(203)]  # 203 samples of 1..101 tokens, not sorted


def grouped(num_replicas: int = 1, rank: int = 0, batch_size: int = 4, **kwargs) -> ResumableSampler:
    return ResumableSampler(len(LENGTHS), num_replicas, rank, seed=SEED, lengths=LENGTHS, batch_size=batch_size,
                            **kwargs)


def padding(order: list[int], batch_size: int) -> int:
    """Pad tokens of right-padded batches taken from `order` in turn."""
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    return sum(len(b) * max(LENGTHS[i] for i in b) - sum(LENGTHS[i] for i in b) for b in batches)


@pytest.mark.parametrize("epoch", [0, 1, 5])
def test_grouping_yields_every_sample_exactly_once_per_epoch(epoch):
    sampler = grouped()
    sampler.set_epoch(epoch)
    assert sorted(sampler) == list(range(len(LENGTHS)))
    assert len(sampler) == len(list(sampler))


def test_grouping_cuts_padding_against_a_plain_shuffle():
    plain = list(ResumableSampler(len(LENGTHS), seed=SEED))
    assert padding(list(grouped(batch_size=8)), 8) < 0.2 * padding(plain, 8)


def test_grouping_is_a_pure_function_of_seed_and_epoch():
    first, again = grouped(), grouped()
    first.set_epoch(2)
    again.set_epoch(2)
    assert list(first) == list(again)
    first.set_epoch(3)
    assert list(first) != list(again)
    assert list(grouped()) != list(ResumableSampler(len(LENGTHS), seed=SEED + 1, lengths=LENGTHS, batch_size=4))


def test_grouping_resumes_with_the_remaining_tail():
    sampler = grouped()
    sampler.set_epoch(1)
    full = list(sampler)
    sampler.skip(13)
    assert list(sampler) == full[13:]


def test_grouping_puts_the_longest_sample_in_the_first_batch():
    for epoch in range(3):
        sampler = grouped()
        sampler.set_epoch(epoch)
        assert max(LENGTHS) in [LENGTHS[i] for i in list(sampler)[:4]]


@pytest.mark.parametrize("num_replicas", [2, 3])
def test_grouped_ranks_partition_the_epoch_and_match_one_process_step_by_step(num_replicas):
    # 198 samples: a multiple of 2 and 3, so no rank setup drops one (a dropped sample moves the windows).
    b, lengths = 4, LENGTHS[:198]

    def sampler(replicas: int, rank: int, batch_size: int) -> list[int]:
        return list(ResumableSampler(len(lengths), replicas, rank, seed=SEED, lengths=lengths, batch_size=batch_size))

    ranks = [sampler(num_replicas, rank, b) for rank in range(num_replicas)]
    single = sampler(1, 0, b * num_replicas)
    assert sorted(i for share in ranks for i in share) == sorted(single) == list(range(len(lengths)))
    # Step k of the ranks (batch b each) holds the same samples as step k of one process with batch num_replicas * b.
    for step in range(len(ranks[0]) // b):
        together = {i for share in ranks for i in share[step * b:(step + 1) * b]}
        assert together == set(single[step * b * num_replicas:(step + 1) * b * num_replicas])


def test_grouping_rejects_lengths_of_another_dataset():
    with pytest.raises(ValueError, match="lengths has 3 entries for 4 samples"):
        ResumableSampler(4, lengths=[1, 2, 3])
