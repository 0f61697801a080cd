"""Errors a request can cause, and the two envelopes they are sent in.

OpenAI:    {"error": {"message", "type", "param", "code"}}
Anthropic: {"type": "error", "error": {"type", "message"}}
"""
from __future__ import annotations

# kind -> (OpenAI type, Anthropic type)
_TYPES = {
    "invalid_request": ("invalid_request_error", "invalid_request_error"),
    "authentication": ("authentication_error", "authentication_error"),
    "not_found": ("invalid_request_error", "not_found_error"),
    "too_large": ("invalid_request_error", "request_too_large"),
    "rate_limit": ("rate_limit_error", "rate_limit_error"),
    "overloaded": ("server_error", "overloaded_error"),
    "server": ("server_error", "api_error"),
}
_KIND_OF_STATUS = {400: "invalid_request", 401: "authentication", 404: "not_found", 405: "invalid_request",
                   413: "too_large", 422: "invalid_request", 429: "rate_limit", 503: "overloaded"}


class ApiError(Exception):
    """An error answer: HTTP status, one-line message, and where in the request it points (`param`)."""

    def __init__(self, status: int, message: str, *, kind: str | None = None, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind or _KIND_OF_STATUS.get(status, "server" if status >= 500 else "invalid_request")
        self.param = param
        self.code = code
        self.headers = headers or {}

    def openai(self) -> dict:
        """The OpenAI error body."""
        return {"error": {"message": self.message, "type": _TYPES[self.kind][0], "param": self.param,
                          "code": self.code}}

    def anthropic(self) -> dict:
        """The Anthropic error body."""
        return {"type": "error", "error": {"type": _TYPES[self.kind][1], "message": self.message}}

    def body(self, api: str) -> dict:
        """The body in `api`'s envelope ("openai" or "anthropic")."""
        return self.anthropic() if api == "anthropic" else self.openai()


def api_of_path(path: str) -> str:
    """Which API's envelope a path answers in: the Anthropic Messages routes, else OpenAI's."""
    return "anthropic" if path.startswith("/v1/messages") else "openai"


def from_validation(exc, prefix: str = "") -> ApiError:
    """A pydantic ValidationError as one 400 naming the first bad field."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in (*([prefix] if prefix else []), *first.get("loc", ())))
    kind = first.get("type", "")
    code = "missing_required_parameter" if kind == "missing" else "invalid_value"
    message = first.get("msg", "invalid value")
    if kind == "missing":
        message = "field required"
    elif kind in ("extra_forbidden",):
        message = "unknown field"
    return ApiError(400, f"{where}: {message}" if where else message, param=where or None, code=code)
