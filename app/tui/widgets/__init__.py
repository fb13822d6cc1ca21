"""The chat app's widgets: the chat list, a message (and its reasoning), the prompt, the stats
bar, and the models screen's list of GGUF files found on this machine."""
