"""The experiment layer: what a run is (spec, protocol, presets), how it is executed and tuned, and how its record
is built and stored (records, store). It calls the engine (gflbench.core); the engine never calls it.
"""
