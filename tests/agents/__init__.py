"""Agents: the agent CLIs through draftpen launch, and the limits agents live with."""
