"""What every dialect's routes are built over (frontend.app makes one): the router that
carries the API-key check, the shared intake and chat path, and the engine client."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter
from fastapi.routing import APIRoute
from pydantic import BaseModel

from frontend.chat_path import ChatPath
from frontend.cluster.engine_client import EngineClient
from frontend.intake import Intake


@dataclass(frozen=True)
class Room:
    api: APIRouter
    intake: Intake
    chat: ChatPath
    client: EngineClient
    # a body's schema for /openapi.json: bodies are read by hand (frontend.intake)
    body_schema: Callable[[type[BaseModel]], dict]

    def post(
        self,
        path: str,
        endpoint: Callable[..., Any],
        body: type[BaseModel],
        route_class: type[APIRoute] | None = None,
    ) -> None:
        """A POST route whose body (read by hand) /openapi.json describes as `body`."""
        extra: dict[str, Any] = {} if route_class is None else {"route_class_override": route_class}
        self.api.add_api_route(
            path, endpoint, methods=["POST"], openapi_extra=self.body_schema(body), **extra
        )
