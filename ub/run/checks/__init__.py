"""Checks on a run: before it starts (``preflight``, and the GPU memory plan, ``gpu_plan``) and
of its folder, with repairs (``ub doctor``: ``doctor``)."""
