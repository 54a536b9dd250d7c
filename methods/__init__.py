"""The benchmark's own method, FedGMC, and its ablations; registered through the `gflbench.methods` entry points."""
