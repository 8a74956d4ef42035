"""What a run is asked to do: the protocol schema and its YAML loading (pydantic and yaml, no torch)."""
