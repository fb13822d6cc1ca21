"""What a reply looks like on the way out: chat templates, grammars and constraints
(llguidance), tool calls and their syntax, a repeated call's end, reasoning split from
the answer, stop strings, streamed JSON.

May import the floor's doors (``base``, ``errors``, ``generation_events``) and
``sampling``; never ``speculation`` or a runtime.
"""
