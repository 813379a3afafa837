"""Tests of the trainer bases (`SLTrainer`, `OLTrainer`) and the callback hooks around their loops.

The `OLTrainer` expectations come from the seed, ColossalChat's `coati/trainer/base.py`: hooks
around every collect step with the experience, `sample_buffer` skipping the update-phase
dataloader, `_save_checkpoint(episode + 1)`, `finally` around the fit and episode hooks, and the
abstract `_setup_update_phrase_dataload` (the seed's spelling).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainer.base import OLTrainer, SLTrainer
from trainer.callbacks import Callback
from trainer.data.sampler import ResumableSampler
from trainer.parallel.booster import Booster, SinglePlugin
from trainer.runtime import DistributedEnv


def make_booster() -> Booster:
    return Booster(SinglePlugin(DistributedEnv(0, 0, 1), torch.device("cpu")))


# ---------------------------------------------------------------------------------------------
# OLTrainer


class RecordingCallback(Callback):
    """Appends every hook call to a shared event list, so hooks and trainer calls interleave in order."""

    def __init__(self, events: list) -> None:
        self.events = events

    def on_fit_start(self) -> None:
        self.events.append("fit_start")

    def on_fit_end(self) -> None:
        self.events.append("fit_end")

    def on_episode_start(self, episode: int) -> None:
        self.events.append(("episode_start", episode))

    def on_episode_end(self, episode: int) -> None:
        self.events.append(("episode_end", episode))

    def on_make_experience_start(self) -> None:
        self.events.append("make_experience_start")

    def on_make_experience_end(self, experience) -> None:
        self.events.append(("make_experience_end", experience))

    def on_learn_epoch_start(self, epoch: int) -> None:
        self.events.append(("learn_epoch_start", epoch))

    def on_learn_epoch_end(self, epoch: int) -> None:
        self.events.append(("learn_epoch_end", epoch))

    def on_learn_batch_start(self) -> None:
        self.events.append("learn_batch_start")

    def on_learn_batch_end(self, experience) -> None:
        self.events.append(("learn_batch_end", experience))


class RecordingOLTrainer(OLTrainer):
    """Collects integers as experience and records each template-method call into `events`."""

    def __init__(self, events: list | None = None, callbacks=None, save_interval: int = 0,
                 sample_buffer: bool = False) -> None:
        super().__init__(make_booster(), None, data_buffer=[], sample_buffer=sample_buffer, dataloader_pin_memory=False,
                         callbacks=callbacks)
        self.events = [] if events is None else events
        self.save_interval = save_interval
        self.buffer_sizes_seen_by_learn: list[int] = []
        self.saved_episodes: list[int] = []

    def _before_fit(self, *args, **kwargs) -> None:
        self.events.append("before_fit")

    def _make_experience(self, collect_step: int) -> str:
        self.events.append(("make_experience", collect_step))
        return f"experience-{collect_step}"

    def _setup_update_phase_dataload(self) -> None:
        self.events.append("setup_update_phase_dataload")

    def _learn(self, update_step: int) -> None:
        self._on_learn_batch_start()
        self.buffer_sizes_seen_by_learn.append(len(self.data_buffer))
        self.events.append(("learn", update_step))
        self._on_learn_batch_end(f"batch-{update_step}")

    def _save_checkpoint(self, episode: int) -> None:
        self.saved_episodes.append(episode)
        self.events.append(("save", episode))


def episode_events(episode: int, num_collect_steps: int, num_update_steps: int, sample_buffer: bool = False) -> list:
    events: list = [("episode_start", episode)]
    for step in range(num_collect_steps):  # the seed's `_collect_phase`: hooks around every collect step
        events += ["make_experience_start", ("make_experience", step), ("make_experience_end", f"experience-{step}")]
    if not sample_buffer:
        events.append("setup_update_phase_dataload")
    for step in range(num_update_steps):
        events += [("learn_epoch_start", step), "learn_batch_start", ("learn", step), ("learn_batch_end", f"batch-{step}"),
                   ("learn_epoch_end", step)]
    return events + [("episode_end", episode)]


def test_fit_calls_hooks_and_template_methods_in_loop_order():
    events: list = []
    trainer = RecordingOLTrainer(events, callbacks=[RecordingCallback(events)])
    trainer.fit(num_episodes=2, num_collect_steps=2, num_update_steps=2)
    expected = ["fit_start", *episode_events(0, 2, 2), *episode_events(1, 2, 2), ("save", 2), "fit_end"]
    assert [event for event in events if event != "before_fit"] == expected


def test_make_experience_hooks_fire_once_per_collect_step_with_that_steps_experience():
    events: list = []
    trainer = RecordingOLTrainer(callbacks=[RecordingCallback(events)])
    trainer.fit(num_episodes=1, num_collect_steps=3, num_update_steps=1)
    assert events.count("make_experience_start") == 3
    assert [e[1] for e in events if isinstance(e, tuple) and e[0] == "make_experience_end"] == [
        "experience-0", "experience-1", "experience-2"]


def test_sample_buffer_skips_the_update_phase_dataloader():
    events: list = []
    trainer = RecordingOLTrainer(events, callbacks=[RecordingCallback(events)], sample_buffer=True)
    trainer.fit(num_episodes=1, num_collect_steps=2, num_update_steps=2)
    assert "setup_update_phase_dataload" not in events
    expected = ["fit_start", *episode_events(0, 2, 2, sample_buffer=True), ("save", 1), "fit_end"]
    assert [event for event in events if event != "before_fit"] == expected
    assert trainer.buffer_sizes_seen_by_learn == [2, 2]  # `_learn` samples from the filled buffer itself


def test_episode_and_fit_end_hooks_run_when_an_episode_raises():
    events: list = []

    class Failing(RecordingOLTrainer):
        def _learn(self, update_step: int) -> None:
            raise RuntimeError("boom")

    trainer = Failing(events, callbacks=[RecordingCallback(events)])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(num_episodes=2, num_collect_steps=1, num_update_steps=1)
    assert events[-2:] == [("episode_end", 0), "fit_end"]
    assert ("episode_start", 1) not in events and trainer.saved_episodes == []


def test_every_callback_receives_every_hook_in_registration_order():
    events: list = []

    class Tagged(Callback):
        def __init__(self, tag: str) -> None:
            self.tag = tag

        def on_episode_start(self, episode: int) -> None:
            events.append((self.tag, "episode_start", episode))

        def on_fit_end(self) -> None:
            events.append((self.tag, "fit_end"))

    trainer = RecordingOLTrainer(callbacks=[Tagged("first"), Tagged("second")])
    trainer.fit(num_episodes=2, num_collect_steps=1, num_update_steps=1)
    assert events == [("first", "episode_start", 0), ("second", "episode_start", 0),
                      ("first", "episode_start", 1), ("second", "episode_start", 1),
                      ("first", "fit_end"), ("second", "fit_end")]


def test_learn_sees_the_episode_buffer_and_the_buffer_is_cleared_after_each_episode():
    events: list = []
    trainer = RecordingOLTrainer(events)
    sizes_at_episode_end = []

    class BufferProbe(Callback):
        def on_episode_end(self, episode: int) -> None:
            sizes_at_episode_end.append(len(trainer.data_buffer))

    trainer.callbacks.append(BufferProbe())
    trainer.fit(num_episodes=2, num_collect_steps=3, num_update_steps=2)
    assert trainer.buffer_sizes_seen_by_learn == [3, 3, 3, 3]  # never carries the previous episode over
    assert sizes_at_episode_end == [0, 0]
    assert trainer.data_buffer == []


def test_save_interval_zero_saves_once_at_the_end():
    trainer = RecordingOLTrainer(save_interval=0)
    trainer.fit(num_episodes=3, num_collect_steps=1, num_update_steps=1)
    assert trainer.saved_episodes == [3]


def test_save_checkpoint_receives_the_number_of_episodes_done_as_the_seed_passes_it():
    # The seed: `if save_interval > 0 and (episode + 1) % save_interval == 0: _save_checkpoint(episode + 1)`.
    trainer = RecordingOLTrainer(save_interval=1)
    trainer.fit(num_episodes=3, num_collect_steps=1, num_update_steps=1)
    assert trainer.saved_episodes == [1, 2, 3]  # and not again at the end


def test_save_interval_that_does_not_divide_the_run_still_saves_the_last_episode():
    trainer = RecordingOLTrainer(save_interval=2)
    trainer.fit(num_episodes=3, num_collect_steps=1, num_update_steps=1)
    assert trainer.saved_episodes == [2, 3]


def test_save_happens_after_the_episode_end_hook():
    events: list = []
    trainer = RecordingOLTrainer(events, callbacks=[RecordingCallback(events)], save_interval=1)
    trainer.fit(num_episodes=1, num_collect_steps=1, num_update_steps=1)
    assert events.index(("episode_end", 0)) < events.index(("save", 1)) < events.index("fit_end")


def test_fit_with_zero_episodes_saves_nothing():
    trainer = RecordingOLTrainer()
    trainer.fit(num_episodes=0, num_collect_steps=1, num_update_steps=1)
    assert trainer.saved_episodes == []


def test_fit_resumes_from_num_episodes_done():
    events: list = []
    trainer = RecordingOLTrainer(events, callbacks=[RecordingCallback(events)])
    trainer.num_episodes_done = 1
    trainer.fit(num_episodes=3, num_collect_steps=1, num_update_steps=1)
    assert [e[1] for e in events if isinstance(e, tuple) and e[0] == "episode_start"] == [1, 2]
    assert trainer.num_episodes_done == 3
    assert trainer.saved_episodes == [3]


def test_num_episodes_done_counts_finished_episodes():
    done_at_start = []
    trainer = RecordingOLTrainer()

    class Probe(Callback):
        def on_episode_start(self, episode: int) -> None:
            done_at_start.append(trainer.num_episodes_done)

    trainer.callbacks.append(Probe())
    trainer.fit(num_episodes=2, num_collect_steps=1, num_update_steps=1)
    assert done_at_start == [0, 1]
    assert trainer.num_episodes_done == 2


def test_callbacks_default_is_not_shared_between_instances():
    first, second = RecordingOLTrainer(), RecordingOLTrainer()
    first.callbacks.append(Callback())
    assert second.callbacks == []
    assert first.callbacks is not second.callbacks


def test_callbacks_argument_is_copied():
    given = [Callback()]
    trainer = RecordingOLTrainer(callbacks=given)
    given.append(Callback())
    assert len(trainer.callbacks) == 1


def test_default_save_interval_is_zero():
    trainer = RecordingOLTrainer()
    assert trainer.save_interval == 0
    assert not any(trainer._should_save(episode) for episode in range(5))


def test_misspelled_alias_calls_setup_update_phase_dataload():
    trainer = RecordingOLTrainer()
    trainer._setup_update_phrase_dataload()
    assert trainer.events == ["setup_update_phase_dataload"]


class SeedSpelledOLTrainer(RecordingOLTrainer):
    """Implements the update-phase setup only under the seed's name, as coati's PPOTrainer does."""

    _setup_update_phase_dataload = OLTrainer._setup_update_phase_dataload  # back to the base's (not implemented)

    def _setup_update_phrase_dataload(self) -> None:
        self.events.append("setup_update_phrase_dataload")


def test_subclass_implementing_only_the_seeds_misspelled_setup_is_instantiated_and_called():
    trainer = SeedSpelledOLTrainer()
    trainer.fit(num_episodes=1, num_collect_steps=1, num_update_steps=1)
    assert trainer.events.count("setup_update_phrase_dataload") == 1


def test_subclass_implementing_neither_spelling_of_the_setup_is_abstract():
    class Incomplete(SeedSpelledOLTrainer):
        _setup_update_phrase_dataload = OLTrainer._setup_update_phrase_dataload

    with pytest.raises(TypeError, match="abstract.*_setup_update_phase_dataload"):
        Incomplete()


@pytest.mark.parametrize("name", ["_setup_update_phase_dataload", "_setup_update_phrase_dataload"])
def test_an_update_setup_reaching_the_base_aliases_is_one_clear_error_not_a_recursion(name):
    # A subclass whose own setup defers to the base (`super()`) implements neither for real; before,
    # the base's two spellings called each other until the stack ran out.
    class WithoutSetup(RecordingOLTrainer):
        _setup_update_phase_dataload = OLTrainer._setup_update_phase_dataload

    class Deferring(WithoutSetup):
        pass

    def defer_to_base(self) -> None:
        getattr(super(Deferring, self), name)()

    setattr(Deferring, name, defer_to_base)
    trainer = Deferring()
    with pytest.raises(NotImplementedError, match="Deferring implements neither _setup_update_phase_dataload nor "
                                                  "the seed's spelling _setup_update_phrase_dataload"):
        trainer.fit(num_episodes=1, num_collect_steps=1, num_update_steps=1)


def test_the_base_aliases_on_an_object_made_without_the_instantiation_check_raise_one_clear_error():
    class Incomplete(SeedSpelledOLTrainer):
        _setup_update_phrase_dataload = OLTrainer._setup_update_phrase_dataload

    trainer = object.__new__(Incomplete)  # skips `OLTrainer.__new__`, as unpickling by hand could
    for name in ("_setup_update_phase_dataload", "_setup_update_phrase_dataload"):
        with pytest.raises(NotImplementedError, match="Incomplete implements neither"):
            getattr(trainer, name)()


def test_base_callback_hooks_take_the_seeds_arguments_and_are_no_ops():
    callback = Callback()
    for hook in ("on_fit_start", "on_fit_end", "on_make_experience_start", "on_learn_batch_start"):
        assert getattr(callback, hook)() is None
    for hook in ("on_episode_start", "on_episode_end", "on_learn_epoch_start", "on_learn_epoch_end"):
        assert getattr(callback, hook)(0) is None
    for hook in ("on_make_experience_end", "on_learn_batch_end"):  # the seed passes the experience
        assert getattr(callback, hook)(object()) is None


def test_ol_trainer_requires_its_template_methods():
    with pytest.raises(TypeError, match="abstract"):
        OLTrainer(make_booster(), None, [], False, False)  # type: ignore[abstract]


def test_fit_calls_before_fit_once_before_the_first_episode():
    events: list = []
    trainer = RecordingOLTrainer(events, callbacks=[RecordingCallback(events)])
    trainer.fit(num_episodes=2, num_collect_steps=1, num_update_steps=1)
    assert events.count("before_fit") == 1
    assert events.index("before_fit") < events.index(("episode_start", 0))


# ---------------------------------------------------------------------------------------------
# SLTrainer


class RecordingSLTrainer(SLTrainer):
    """Records the loop's calls; `_train` records the sample indices the sampler yields."""

    def __init__(self, max_epochs: int, start_epoch: int = 0, num_samples: int = 10, stop_after_epoch=None,
                 with_sampler: bool = True) -> None:
        model = nn.Linear(2, 1)
        booster = make_booster()
        super().__init__(booster, max_epochs, model, torch.optim.SGD(model.parameters(), lr=0.1), booster.plugin,
                         start_epoch=start_epoch)
        self.num_samples = num_samples
        self.stop_after_epoch = stop_after_epoch
        self.with_sampler = with_sampler
        self.events: list = []
        self.seen: dict[int, list[int]] = {}

    def _before_fit(self, *args, **kwargs) -> None:
        self.events.append(("before_fit", args, kwargs))
        if self.with_sampler:
            self.train_sampler = ResumableSampler(self.num_samples, seed=3)

    def _train(self, epoch: int) -> None:
        self.events.append(("train", epoch))
        if self.train_sampler is not None:
            self.seen[epoch] = list(self.train_sampler)

    def _eval(self, epoch: int) -> None:
        self.events.append(("eval", epoch))

    def _should_stop(self) -> bool:
        return self.stop_after_epoch is not None and self.events[-1] == ("eval", self.stop_after_epoch)


def epoch_order(epoch: int, num_samples: int = 10, seed: int = 3) -> list[int]:
    sampler = ResumableSampler(num_samples, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def test_sl_fit_calls_before_fit_once_then_train_and_eval_per_epoch():
    trainer = RecordingSLTrainer(max_epochs=3)
    trainer.fit("loader", flag=True)
    assert trainer.events == [("before_fit", ("loader",), {"flag": True}),
                              ("train", 0), ("eval", 0), ("train", 1), ("eval", 1), ("train", 2), ("eval", 2)]


def test_sl_fit_starts_from_start_epoch():
    trainer = RecordingSLTrainer(max_epochs=3, start_epoch=2)
    trainer.fit()
    assert [event for event in trainer.events if event[0] != "before_fit"] == [("train", 2), ("eval", 2)]


def test_sl_fit_sets_the_sampler_epoch_each_epoch():
    trainer = RecordingSLTrainer(max_epochs=3)
    trainer.fit()
    assert trainer.seen == {epoch: epoch_order(epoch) for epoch in range(3)}
    assert trainer.seen[0] != trainer.seen[1]


def test_sl_fit_skips_consumed_samples_only_in_the_resumed_epoch():
    trainer = RecordingSLTrainer(max_epochs=4, start_epoch=1)
    trainer.start_sample_in_epoch = 4
    trainer.fit()
    assert trainer.seen == {1: epoch_order(1)[4:], 2: epoch_order(2), 3: epoch_order(3)}


def test_sl_fit_stops_when_should_stop_says_so():
    trainer = RecordingSLTrainer(max_epochs=5, stop_after_epoch=1)
    trainer.fit()
    assert [event for event in trainer.events if event[0] != "before_fit"] == [
        ("train", 0), ("eval", 0), ("train", 1), ("eval", 1)]


def test_sl_fit_runs_without_a_sampler():
    trainer = RecordingSLTrainer(max_epochs=2, with_sampler=False)
    trainer.fit()
    assert [event[0] for event in trainer.events] == ["before_fit", "train", "eval", "train", "eval"]


def test_sl_fit_with_start_epoch_at_max_epochs_runs_no_epoch():
    trainer = RecordingSLTrainer(max_epochs=2, start_epoch=2)
    trainer.fit()
    assert [event[0] for event in trainer.events] == ["before_fit"]
