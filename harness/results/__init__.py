"""What a run leaves behind: the result schema, curves, gap metrics and their catalog, tidy tables and the
MLflow mirror (no torch, so a site can be built where torch is absent)."""
