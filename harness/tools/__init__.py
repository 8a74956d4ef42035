"""Commands around runs: preflight checks, the method contract check and the throughput benchmarks."""
