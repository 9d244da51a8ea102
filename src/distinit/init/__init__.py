"""distinit.init (under construction)."""

__all__: list[str] = []
