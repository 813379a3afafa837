"""KFP components and the launcher they share: KFP inputs in, a PyTorchJob out, Model and Metrics back."""
