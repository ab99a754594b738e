"""Search: enumerate plans as arrays, prune with named rules, evaluate vectorised, rank."""
