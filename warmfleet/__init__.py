"""warmfleet: serve one local LLM to many agents at once."""

__version__ = "0.1.0"
