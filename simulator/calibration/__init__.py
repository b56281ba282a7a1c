"""Calibration against reality: kernel profiling into cost tables (torch, an optional extra), import of
real PyTorch-profiler traces, and the comparison of measured with simulated runs."""
