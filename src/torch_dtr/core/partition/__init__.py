"""Partitioning a traced iteration across devices (MegTaiChi's DTP): placements, strategies, plans. No torch.

``graph`` (tensors, ops, placements and what converting them costs), ``rules`` (each op's strategies),
``plan`` (what a plan costs, the fixed strategies and the planner). ``sim/partition.py`` builds graphs from
operator logs, replays plans through the DTR runtime per device and holds the exact (ILP) planner.
"""

from .graph import ANY, Graph, Link, Node, P, Place, R, Tensor, show
from .plan import Cost, Plan, Planner
from .rules import Strategy, strategies

__all__ = ["ANY", "P", "R", "Cost", "Graph", "Link", "Node", "Place", "Plan", "Planner", "Strategy", "Tensor",
           "show", "strategies"]
