"""The ILP model: Checkmate's integer linear program, the exact oracle for small instances.

Jain et al. (MLSys 2020): a graph's training graph (forward and backward vertices) is
scheduled in stages, each computing and keeping binaries, under a memory budget, solved with
HiGHS. Here are the training graph, the ILP's matrices, its solver, and the adapter that
solves a chain with it and replays the result under the chain simulator; and, for chains
the ILP does not model (options, tapes), a small integer program bounding their optimum
over all sequences from below (:mod:`solver.ilp.chain_bound`).
"""

from .chain_bound import ChainBound, chain_time_bound
from .solve import IlpSolution, ilp_min_peak, solve_ilp
from .training_graph import TrainingGraph

__all__ = ["ChainBound", "chain_time_bound", "IlpSolution", "ilp_min_peak", "solve_ilp", "TrainingGraph"]
