"""Test distributed code on real process groups: ``run_distributed`` and the pytest plugin."""

__all__: list[str] = []
