"""The runtimes under the engine: llama.cpp, MLX, workers and split targets, hybrid
targets, runtime crashes, and conformance across runtimes."""
