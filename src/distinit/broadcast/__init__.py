"""distinit.broadcast (under construction)."""

__all__: list[str] = []
