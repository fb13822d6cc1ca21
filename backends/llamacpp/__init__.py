"""The llama.cpp runtime (llama-cpp-python: CUDA, Metal or the CPU): loading a GGUF model
and its context, the vocabulary and chat template, rolling back the cache (KV and
recurrent-state snapshots), the MTP head, and the reference decoder bench compares with.

The only package that imports ``llama_cpp``. May import the floor's doors (``base``,
``errors``, ``generation_events``), ``sampling`` and ``output``; never ``speculation``.
"""
