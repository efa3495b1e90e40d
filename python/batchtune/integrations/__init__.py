"""Shapes that users of other tools already know (see lightning.py, accelerate.py)."""
