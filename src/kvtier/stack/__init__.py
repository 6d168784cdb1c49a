"""The tier stack: specs, the registry of tier kinds, the stack, movement between tiers and
the job table (the scheduler side's control plane)."""
