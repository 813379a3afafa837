"""register_model: put a model in the MLflow model registry."""

from kfp import dsl
from kfp.dsl import Input, Model

from components.images import LAUNCHER_IMAGE


@dsl.component(base_image=LAUNCHER_IMAGE)
def register_model(model: Input[Model], name: str) -> str:
    """Log a model directory to MLflow and register it as a new version of `name`.

    Args:
        model: The HF model directory to register.
        name: Registered model name.

    Returns:
        The new model version.
    """
    from components.register.registry import register_directory

    return register_directory(model.path, name)
