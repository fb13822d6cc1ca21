"""Speculative decoding: the one loop, sampling and its filters, constraints, drafters, the
draft policy and its costs, and log-probabilities."""
