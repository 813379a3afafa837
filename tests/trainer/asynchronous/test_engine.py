"""The experience-driven API as the seed's newer `trinity/trainer/trainer.py` writes it: which methods
are coroutines, and which engine a config gets. (What the methods return is checked on the real
engine in `tests/integration/test_async.py`.)"""

import inspect

import pytest

from tests.conftest import make_config
from trainer.asynchronous.engine import TrainEngineWrapper, Trainer, get_trainer_wrapper
from trainer.errors import ConfigError


def test_trainer_coroutines_and_plain_methods_follow_the_seed():
    for name in ("prepare", "train", "train_step", "need_sync", "sync_weight", "shutdown", "is_alive"):
        assert inspect.iscoroutinefunction(getattr(Trainer, name)), name
    for name in ("save_checkpoint", "need_save"):  # plain methods in the seed; save_checkpoint returns metrics
        assert not inspect.iscoroutinefunction(getattr(Trainer, name)), name
    assert inspect.signature(Trainer.save_checkpoint).parameters.keys() == {"self", "block_until_saved", "save_as_hf"}


def test_engine_wrapper_coroutines_and_plain_methods_follow_the_seed():
    for name in ("prepare", "train_step"):
        assert inspect.iscoroutinefunction(getattr(TrainEngineWrapper, name)), name
    for name in ("save_checkpoint", "sync_weight", "upload_state_dict", "save_state_dict"):
        assert not inspect.iscoroutinefunction(getattr(TrainEngineWrapper, name)), name
    assert isinstance(inspect.getattr_static(TrainEngineWrapper, "train_step_num"), property)


def test_only_online_stages_get_an_engine(tmp_path, tiny_model, task_files):
    config = make_config("sft", tmp_path, tiny_model, task_files["sft_train"])
    with pytest.raises(ConfigError, match="supports ppo and grpo"):
        get_trainer_wrapper(config)
