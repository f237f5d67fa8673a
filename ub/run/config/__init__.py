"""A run's config: its schema (``schema``), loading and checking one (``load``), its docs and
``ub config show`` (``docs``), and the run's base model (``base_model``)."""
