"""The chat app (Textual): ``app.py`` and ``app.tcss``, ``screens/``, ``widgets/``.

``launch`` starts it with the real engine loader; ``reply`` holds a reply's figures;
``models_service`` is what the models screen asks of the catalog and the store. May
import ``app.models``, ``app.chats``, ``app.loading``, ``app.settings``, ``app.errors``,
``app.rates`` and ``backends``; never another front end (``cli``, ``server``, ``bench``).
"""
