"""distinit.watchdog (under construction)."""

__all__: list[str] = []
