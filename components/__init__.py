"""KFP components and the launcher they share: KFP inputs in, a PyTorchJob out, Model and Metrics back."""

from trainer.lifecycle.collector import freeze_at_exit

# Each component runs in a short process of its own (KFP's executor); at exit the interpreter's last collection
# would walk everything kfp, mlflow and boto3 imported, for nothing (trainer/lifecycle/collector.py).
freeze_at_exit()
