"""The layout of Kubeflow Trainer's initializer images (`/app/pkg/initializers/...`), with a stand-in inside."""
