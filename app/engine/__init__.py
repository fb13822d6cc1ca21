"""The engine: the process that holds the loaded pair and serves every client (the chat
app, the plain REPL, agents) over the Unix socket with an OpenAI-compatible API
(``draftpen serve``), and the runtime process it starts for the pair and the loop:
``runtime_supervisor`` (the front's side: starts it, sends it jobs, answers for it when
it dies, starts it again), ``runtime_child`` (the runtime process's main),
``runtime_wire`` (what crosses between them), ``runtime_link`` (the process and its
pipe), ``runtime_jobs`` (a job as the front tracks it), ``runtime_deaths`` (why it died;
when to stop starting it), ``serve_runtime`` (what serve's runtime is built from) and
``engine_parts`` (what the routes ask of either shape).

``api`` holds the routes and the one chat path every dialect takes (``request_body``
reads a body); ``dialects/`` holds one module per dialect, each its request models and
its answer's format (``openai_chat_schema`` is the one internal request every chat
dialect becomes; ``openai_chat_format``, ``openai_completions``, ``anthropic_*``,
``openai_responses``); ``schema`` holds ``ApiError``, the fields every generation
shares and ``parse_request``; ``job_requests`` turns a request into its prompt and
``GenerationRequest``; ``chunks`` is the shape every answer shares and its SSE framing;
``job_responses`` turns a job's items into a streamed or whole answer (``choices``: a
chat request's ``n`` > 1 choices, one after another);
``tally`` sums a generation's events; ``pairs`` says which pairs can be served;
``scheduler`` holds the pair in memory (loads on demand, keep-alive); ``queue`` runs one
job at a time on one worker thread; ``unix_socket`` owns the socket file; ``runner``
starts and stops the server (and stops it when idle); ``command`` is ``serve``'s options
(``cache_options``: the budgets of what it keeps between requests);
``crash_record`` keeps, beside the socket, what the engine is doing and the fatal signal
it died by, for clients to explain a runtime crash.

May import: ``app.client`` (the wire's shapes both ends share; ``find_engine``, to say
who holds the socket; the crash record's format), ``app.models``,
``app.chats``, ``app.settings``, ``app.errors``, ``app.loading``, ``backends``. Only
``app.main`` imports it: front ends reach the engine over the socket, through
``app.client``.
"""
