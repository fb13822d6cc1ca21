"""Packaging and the house: the user's install, the llama.cpp build and runtime check,
doctor, import boundaries and module sizes."""
