"""Benchmarks and the device harness for pallas-gemm."""
