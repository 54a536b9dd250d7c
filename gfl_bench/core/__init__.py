"""The engine: the Method contract, the exchange of messages, the round loop and its two executors (each client
alone, or every client in one batched pass), and what they share (aggregation, training, metrics, random streams).

Nothing here imports the experiment layer (gflbench.experiments): the round loop returns a result that the
experiment layer turns into a stored record (docs/architecture.md, "Layers").
"""
