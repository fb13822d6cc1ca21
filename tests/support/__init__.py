"""Helpers that tests in several areas share: fake and scripted models, real model files
and runtimes, the chat app's harness, a local hub."""
