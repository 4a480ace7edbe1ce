"""Benchmarks that start services: the loopback cluster under chaos, orchestration round trips, uploads."""
