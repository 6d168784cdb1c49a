"""The tier stack: specs and their parsing, tier kinds (their contract, options and
capabilities) and their registry, the builders, the stack, movement between tiers and the
job table (the scheduler side's control plane)."""
