"""The pod/platform settings of a stage's job, and where their values come from.

- `platform.py`: the platform's defaults and policy, read from the component pod's environment
  (the chart's defaults ConfigMap), and the allow-lists;
- `scheduling.py`: the checks of a setting's value, and a run's `scheduling` overrides.
"""
