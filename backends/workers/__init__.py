"""Workers: other machines that hold part of a target's layers (``draftpen worker``).

A worker is llama.cpp's RPC server (ggml-rpc) started from this draftpen's own
llama.cpp library, so its protocol is the one the main machine speaks. This package is
what needs no runtime: the address rules and what makes an address safe to listen on
(``endpoints``), a short conversation with a worker that learns its protocol version and
memory without the runtime (``wire``), and how a target's layers are shared out
(``split``). ``backends/llamacpp/ggml_devices.py`` registers the workers with llama.cpp.
"""
