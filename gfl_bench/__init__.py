"""gflbench: a benchmark harness for subgraph federated learning (node classification).

Data flows one way: dataset -> partition -> clients -> rounds -> records -> tables.
"""

__version__ = "0.1.0"
