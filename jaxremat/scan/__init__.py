"""The scan frontend: one layer scanned over stacked parameters, as nested scans.

* :mod:`.remat`: :func:`jaxremat.remat_scan`; :mod:`.plan`: the plan it reports;
* :mod:`.members` and :mod:`.family`: the nested-scan plans and the exact choice among them;
* :mod:`.simulate`: the solver's simulator on a nested-scan plan;
* :mod:`.held`: what the layer's loop bodies hold beside its profile (loop_margin's terms);
  :mod:`.margins`: those terms per option, from programs traced once per layer with symbolic
  sizes;
* :mod:`.loops`: what a scan of stored layers holds beside the chain, op by op.
"""
