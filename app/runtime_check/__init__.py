"""The runtime check: does the installed llama.cpp build actually run on this CPU?

A build that compiles is not a runtime that runs: llama.cpp's CPU kernels differ by
instruction set (AVX2, AVX-512, AMX) and some crash on some machines (llama.cpp
#20824: the AMX matmul segfaults on the first batched decode). So the installer and
``draftpen doctor`` load a tiny random-weight model in a *child* process and decode a
few tokens, one at a time and then as a batch; a crash kills the child, not the caller,
and its signal says what went wrong.

- ``tiny_model``: writes the model (``gguf`` package; no download).
- ``probe``: what the child runs (``python -m app.runtime_check.probe MODEL``).
- ``check``: runs the child with a timeout and turns its exit into a
  :class:`~app.runtime_check.check.RuntimeCheck`; ``diagnosis`` says what a signal means
  and how to fix it; ``cpu_features`` compares this CPU with the build.
- ``__main__``: ``python -m app.runtime_check``, the installer's step;
  ``install_record`` keeps its result in the environment for ``draftpen doctor``.

May import ``backends`` (the child loads the model through ``backends.llamacpp.model``) and
``app.errors``; never a front end.
"""
