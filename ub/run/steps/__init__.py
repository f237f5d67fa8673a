"""The steps of a round, one module each (``plan``, ``play``, ``learn``, ``evaluate``, ``rate``,
``manifest``, ``tracking``), the run they all take (``rounds``), a round's collapse warnings
(``health``) and what ``ub train`` prints (``progress``)."""
