"""OpenAI's error shape, shared by the ingress (admission, auth, limits) and the engines' own OpenAI
layers: every refusal is ``{"error": {...}}`` with the right status, so the official client raises the
right exception."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError


class ApiError(Exception):
    """An error to return as ``{"error": {...}}`` with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def parse_body(model: type[BaseModel], body: Any) -> Any:
    """``body`` validated as ``model``; the first problem becomes a 400 naming the field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        message = first.get("msg", "invalid request")
        if first.get("type") == "missing":
            message = f"missing required field '{param}'"
        elif param:
            message = f"invalid '{param}': {message}"
        raise ApiError(400, message, param=param, code="invalid_request") from None
    except UnicodeEncodeError:
        raise ApiError(400, "the request has a string that is not valid Unicode (a lone surrogate)") from None
