"""The ``tiered`` command line: ``serve``, ``gc`` and ``verify``."""
