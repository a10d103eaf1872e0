"""The chain frontend: a sequence of layers, profiled into Rotor's chain, planned, applied.

* :mod:`.profile` and :mod:`.options`: each layer's sizes and costs (``solver.Chain``), and its
  checkpoint-policy options; :mod:`.calibration`: their static costs at a layer's later
  input shapes, scaled from the first shape's lowering;
* :mod:`.policies`: the menu of ``jax.checkpoint`` policies; :mod:`.ranked`: the opt-in
  ``"dots_ranked"`` policies, matmul outputs kept by contraction size;
* :mod:`.plan` and :mod:`.plot`: what the solver decided, printed and drawn;
* :mod:`.apply` and :mod:`.flat_apply`: the plan as nested ``jax.checkpoint`` (or
  ``jax.custom_vjp``) segments;
* :mod:`.remat`: :func:`jaxremat.remat_sequence`, the public entry point.
"""
