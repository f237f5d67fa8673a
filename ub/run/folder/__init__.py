"""A run's folder: its paths (``layout``), roots that are URLs (``urls``), its copy in a store
(``store``), its tables (``views``), its lock and its log files."""
