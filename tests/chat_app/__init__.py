"""The chat app and the command line: the Textual app through its pilot, the plain chat,
generate, bench, history and settings."""
