"""Many runs: sweep files and their plan, stages with shared references, the local and Ray executors, and
the one MLflow mirror of a stored run (mirror.py)."""
