"""The chat app's widgets: the chat list, a message, the prompt, the stats bar."""
