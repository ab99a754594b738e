"""Topology: the cluster graph, rank placement and collective cost."""
