"""Sweeps: a grid over run options (``spec``), the ways to train it (``executors``), and the named sweeps (``catalogue``)."""
