"""OpenAI's Responses API: ``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``.

A thin adapter, as every dialect is: the request is read as the engine's one chat
request (:mod:`.responses_request`) and answered by :meth:`AgentApi.respond_chat`, the
same path as chat completions (prompt, tools' grammar, limits, queue, loop, caches);
only the answer's shape is the Responses API's (:mod:`.responses_format`).

``store`` (true unless the request says false) keeps the finished response in a
bounded in-memory store (:mod:`.responses_store`): ``GET`` reads it back, ``DELETE``
forgets it, and ``previous_response_id`` continues its conversation (its input and
output items come before the new input; its ``instructions`` do not carry over, as
OpenAI's do not). Agents such as Codex send ``store: false`` and the whole
conversation every turn; the engine's conversation cache then reads only what is new.
Errors have OpenAI's shape (``ApiError.body``); in a stream, ``response.failed``.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.engine.dialects.responder import ChatResponder
from app.engine.dialects.responses_format import new_item_id, responses_format
from app.engine.dialects.responses_items import InputItem
from app.engine.dialects.responses_request import parse_responses_request, read_turn
from app.engine.dialects.responses_store import ResponsesStore
from app.engine.schema import ApiError


class ResponsesRoutes:
    """The Responses API's handlers over one engine's API, and its store."""

    def __init__(self, api: ChatResponder, store: ResponsesStore | None = None) -> None:
        self.api = api
        self.store = store or ResponsesStore()

    async def create(self, request: Request) -> Response:
        """``POST /v1/responses``."""
        parsed = parse_responses_request(await self.api.read_json(request))
        earlier: tuple[InputItem, ...] = ()
        if parsed.previous_response_id is not None:
            previous = self.store.get(parsed.previous_response_id)
            if previous is None:
                raise _not_found(parsed.previous_response_id, "previous_response_id")
            earlier = previous.conversation
        # Validating a long conversation and its schemas is CPU work: off the event loop.
        turn = await asyncio.to_thread(read_turn, parsed, earlier)
        return await self.api.respond_chat(
            request,
            turn.chat,
            responses_format(turn, self.store),
            response_id=new_item_id("resp"),
        )

    async def get(self, request: Request) -> Response:
        """``GET /v1/responses/{id}``: a stored response."""
        response_id = request.path_params["response_id"]
        entry = self.store.get(response_id)
        if entry is None:
            raise _not_found(response_id)
        return JSONResponse(entry.response)

    async def delete(self, request: Request) -> Response:
        """``DELETE /v1/responses/{id}``: forget a stored response."""
        response_id = request.path_params["response_id"]
        if not self.store.delete(response_id):
            raise _not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    def routes(self) -> list[Route]:
        """The routes, for the engine's app."""
        return [
            Route("/v1/responses", self.create, methods=["POST"]),
            Route("/v1/responses/{response_id}", self.get, methods=["GET"]),
            Route("/v1/responses/{response_id}", self.delete, methods=["DELETE"]),
        ]


def responses_routes(api: ChatResponder) -> list[Route]:
    """The Responses API's routes over ``api``, with a store of their own."""
    return ResponsesRoutes(api).routes()


def _not_found(response_id: str, param: str | None = None) -> ApiError:
    return ApiError(
        404,
        f"No response with id '{response_id}' is stored here. draftpen keeps responses sent "
        "with store true (the default) in memory, the most recent ones only, until the "
        "engine stops; send the earlier items in input instead.",
        param=param,
        code="response_not_found",
    )
