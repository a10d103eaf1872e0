"""Measurement: what a JAX program costs, read from its jaxpr, its lowering or the device.

* :mod:`.meter` and :mod:`.liveness`: memory in program order (the meter that sees
  rematerialization on CPU, where XLA undoes it);
* :mod:`.trace`: one layer's vjp, its tape and transients;
* :mod:`.symbolic`: programs traced with a symbolic batch size, made concrete at each size
  and compared equation by equation;
* :mod:`.costs` and :mod:`.timing`: flops and bytes before XLA optimises (lowered, or
  counted on a jaxpr term by term), and measured time;
* :mod:`.dataflow`: the dataflow graph of a function, for the graph solver;
* :mod:`.device`: how much memory a device leaves for activations;
* :mod:`.offload`: whether a device can keep residuals in host memory, its bandwidth, and
  the cost of an offloaded tape.

Nothing here plans or applies a plan; the frontends (:mod:`jaxremat.sequence`,
:mod:`jaxremat.graph`, :mod:`jaxremat.scan`, :mod:`jaxremat.flax`) build on it.
"""
