"""What the engine keeps between requests so a prompt is not read twice: the conversation
cache (KV states of recent conversations in RAM).

May import the floor's doors, ``sampling``, ``output`` and ``speculation`` (a kept
conversation carries its drafter's state); never a runtime.
"""
