"""The graph frontend: Feng & Huang's checkpoints on any JAX function.

* :mod:`.remat`: :func:`jaxremat.remat_graph`;
* :mod:`.budget`: its budget, enforced on measured memory.

The dataflow graph it plans on is read by :mod:`jaxremat.measure.dataflow`.
"""
