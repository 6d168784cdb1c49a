"""The disk tier: slab files of fixed-size slots under one directory (see slab.py)."""
