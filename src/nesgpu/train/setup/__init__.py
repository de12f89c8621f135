"""A run's configuration and what it is built from: ``TrainConfig`` (the options, each a CLI flag), the task
defaults and presets, their validation, the initial weights, and ``build`` (task, model, population, step)."""
