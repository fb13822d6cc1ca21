"""The chat app (Textual): ``app.py`` and ``app.tcss``, ``screens/``, ``widgets/``.

A client of the engine: ``launch`` starts it with the real connector (find or start
``draftpen serve``); replies stream through ``app.client``, and nothing here decodes.
``streaming`` streams a reply on a worker thread, ``reply`` holds its figures,
``live_text`` where its finished Markdown ends, ``priority`` lowers the UI while a
reply is written; ``models_service`` is what the models screen asks of the catalog
and the store (downloads stay local). May import
``app.client``, ``app.models``, ``app.chats``, ``app.settings``, ``app.errors``,
``app.rates`` and ``backends`` (data types); never another front end (``cli``,
``engine``, ``bench``), and never ``app.loading`` or ``backends.engine``.
"""
