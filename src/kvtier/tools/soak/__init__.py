"""``kvtier soak``: long mixed traffic on a real engine with faults injected at random,
checked against an oracle run without kvtier (see :mod:`kvtier.tools.soak.run`)."""
