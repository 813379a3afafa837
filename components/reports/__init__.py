"""Reports people look at in the Kubeflow UI: curve plots and side-by-side comparisons, as HTML."""
