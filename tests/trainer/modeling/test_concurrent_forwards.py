"""Two forwards side by side on the CPU (`trainer.modeling.concurrent_forwards`), and DPO's use of it: the same
loss and gradients as one after the other, the thread count restored, errors raised."""

import threading

import pytest
import torch

from tests.trainer.algorithms.stand_ins import BigramLM
from tests.trainer.algorithms.test_dpo import POLICY, preference_batch
from trainer.algorithms import dpo
from trainer.algorithms.dpo import DPOObjective
from trainer.modeling.concurrent_forwards import can_run_concurrently, run_concurrently

REFERENCE = [[2, 1, 1, 4], [1, 3, 1, 1], [1, 1, 2, 2], [1, 2, 1, 1]]  # a bigram table unlike the policy's


@pytest.fixture
def two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def test_each_side_runs_on_its_own_thread_with_half_the_threads_and_the_count_is_restored(two_threads):
    def report():
        return threading.get_ident(), torch.get_num_threads()

    (side_thread, side_threads), (main_thread, main_threads) = run_concurrently(report, report)
    assert side_thread != main_thread == threading.get_ident()
    assert side_threads == main_threads == 1
    assert torch.get_num_threads() == 2


def test_an_error_on_either_side_is_raised_after_both_ended_and_the_count_restored(two_threads):
    ended = threading.Event()

    def slow_side():
        ended.wait(0.05)
        ended.set()

    def failing():
        raise ValueError("main failed")

    with pytest.raises(ValueError, match="main failed"):
        run_concurrently(slow_side, failing)
    assert ended.is_set() and torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="main failed"):
        run_concurrently(failing, lambda: None)
    assert torch.get_num_threads() == 2


def test_only_cpu_forwards_with_threads_to_share_run_side_by_side(two_threads):
    model = BigramLM(POLICY)
    assert can_run_concurrently(model, None, device=torch.device("cpu"))
    assert not can_run_concurrently(model, device=torch.device("meta"))
    torch.set_num_threads(1)
    assert not can_run_concurrently(model, device=torch.device("cpu"))


def test_dpo_with_a_live_reference_gives_the_same_loss_and_gradients_side_by_side(two_threads, monkeypatch):
    runs = []
    concurrently = dpo.run_concurrently

    def counted(*args):
        runs.append(1)
        return concurrently(*args)

    monkeypatch.setattr(dpo, "run_concurrently", counted)
    results = {}
    for name, allowed in (("side by side", True), ("one after the other", False)):
        monkeypatch.setattr(dpo, "can_run_concurrently", lambda *models, device, allowed=allowed: allowed)
        policy = BigramLM(POLICY)
        output = DPOObjective(beta=0.5, ref_model=BigramLM(REFERENCE))(policy, preference_batch())
        output.total.backward()
        results[name] = (output.total.detach(), policy.table.weight.grad.clone())
    assert runs == [1]
    torch.testing.assert_close(results["side by side"][0], results["one after the other"][0])
    torch.testing.assert_close(results["side by side"][1], results["one after the other"][1])
    assert results["side by side"][1].abs().sum() > 0  # the reference carried no graph into the loss
