"""Builds the static HTML leaderboard from stored results."""
