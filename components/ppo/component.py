"""train_ppo: PPO against a reward model or a reward function, as a training job (TrainJob or PyTorchJob)."""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from components.images import LAUNCHER_IMAGE


@dsl.component(base_image=LAUNCHER_IMAGE)
def train_ppo(
    base_model: Input[Model],
    train_dataset: Input[Dataset],
    eval_dataset: Input[Dataset],
    reward_model: Input[Model],
    model: Output[Model],
    metrics: Output[Metrics],
    report: Output[Markdown],
    curves: Output[HTML],
    run_id: str,
    reward_function: str = "",
    lr: float = 1e-6,
    num_episodes: int = 10,
    micro_batch_size: int = 8,
    max_length: int = 1024,
    kl_coef: float = 0.05,
    settings: dict = {},
    launcher_mode: str = "kubernetes",
    rollout_engine: str = "hf",
    environment: str = "",
    trainer_image: str = "",
    num_nodes: int = 1,
    gpus_per_node: int = 1,
    s3_secret: str = "",
    job_root: str = "",
    parent_run_id: str = "",
    scheduling: dict = {},
):
    """Optimise a policy with PPO (actor, critic on the reward model, frozen reference).

    Args:
        base_model: The SFT model: the actor starts here and a frozen copy is the reference.
        train_dataset: Prompt rows (prompt, optional answer) as JSONL.
        eval_dataset: Held-out prompt rows (the mean reward before and after is reported).
        reward_model: The reward model scoring responses (and the critic's starting point).
        model: The PPO-trained policy.
        metrics: Final training and evaluation metrics.
        report: Metrics, curves and the resolved config.
        curves: Loss, reward, KL and learning-rate curves against step, as an HTML plot.
        run_id: The pipeline run id (names the job and keys its checkpoints).
        reward_function: Registered reward function name to score with instead of the reward model.
        lr: Peak learning rate of AdamW.
        num_episodes: Collect-then-learn rounds.
        micro_batch_size: Sequences per rank per forward pass; a minibatch is split into these for one step.
        max_length: Longest tokenized sample in tokens; longer samples are truncated.
        kl_coef: Weight of the per-token KL penalty in the reward (initial value if adaptive).
        settings: Any other config fields, as {"dotted.key": value}.
        launcher_mode: `kubernetes` runs a training job (TrainJob or PyTorchJob, the platform's kind); `local` runs
            its nodes as local processes.
        rollout_engine: What samples the responses: `hf` (HF `generate` on the policy), `vllm` (the image's vLLM
            variant) or `auto`: `vllm` where it is installed and pays off (on GPUs; on the CPU from 90M parameters
            and 128 rows a rollout call, the crossover measured in benchmarks/README.md), else `hf`; chosen when the
            policy is loaded and logged. A job with `auto` runs the trainer image's vLLM variant.
        environment: Multi-turn episodes in this allowed environment (`environment.name`, docs/agents.md; its
            limits and tools through `settings`); empty samples one response per prompt.
        trainer_image: Image of the training job; empty uses the platform's trainer image (one the platform allows).
        num_nodes: Nodes (pods) of the job.
        gpus_per_node: GPUs per node (one process each; 0 runs one CPU process).
        s3_secret: Name of an existing Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
        job_root: Checkpoint and log root of this stage; empty uses a folder beside the model.
        parent_run_id: The pipeline's MLflow run (from open_lineage); this stage's run nests under it.
        scheduling: Overrides of the platform's scheduling defaults for this job's pods, e.g.
            {"cpu_request": "8", "memory_limit": "96Gi", "active_deadline_seconds": 86400,
            "pending_timeout_seconds": 600}; keys are listed in components/launcher/settings/options.py.
    """
    from components.launcher.component_io import run_training_component

    run_training_component("ppo", locals())
