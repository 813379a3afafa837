"""Trinity-RFT's `trinity.trainer.verl` layer, on native PyTorch: no Ray, no verl.

The seed runs verl's FSDP workers as Ray actors and drives them from `VerlPPOTrainerWrapper`.
Here the same roles are plain objects in the trainer process, with the seed's names and methods:

- `data_proto`: `DataProto` (one step's experiences as one batch), `to_data_proto`,
  `compute_data_metrics` (seed: `trinity/trainer/verl/utils.py`);
- `dp_actor`: `DataParallelPPOActor` (`set_algorithm`, `compute_log_prob`, `update_policy`) and
  `DataParallelPPOCritic` (seed: `dp_actor.py`, verl's `dp_critic.py`);
- `fsdp_checkpoint_manager`: `FSDPCheckpointManager` (`upload_state_dict`, `save_state_dict`,
  `save_checkpoint`, `wait_on_save_thread`) over `trainer.checkpointing.checkpoint.CheckpointManager`, and the
  `CheckpointMonitor` that makes one step's actor and critic shares one atomic checkpoint;
- `fsdp_workers`: `ActorRolloutRefWorker` and `CriticWorker`;
- `verl_trainer`: `TorchTrainEngine`, the `TrainEngineWrapper` that composes them (seed:
  `VerlPPOTrainerWrapper`).

The "FSDP" in the names is the seed's; the workers run on whatever `parallel.plugin` the config
names through the project's `Booster`. Every optimizer step is `trainer.algorithms.update.train_step`
with the objective the colocated loop uses (the stage's algorithm object, `trainer.algorithms.online`).
"""
