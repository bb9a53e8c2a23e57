"""Low-Rank Clone distillation and its train-what-you-deploy arms."""

__version__ = "0.1.0"
