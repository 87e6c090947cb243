"""Architectures as data: one module per family turns GGUF keys into the per-layer view memory,
speed and the planner read (base.py: the view; registry.py: the one check; family.py: the
contract a family module fulfils). Pure."""
