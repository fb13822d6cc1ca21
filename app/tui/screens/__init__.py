"""The chat app's screens: chat (on ``reply_writing``, which shows a reply as it is
written), models, settings, help, and small dialogs."""
