"""The chat app's screens: chat, models, settings, help, and small dialogs."""
