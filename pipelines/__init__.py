"""KFP pipelines composed from alignflow's components, and the `alignflow` CLI."""
