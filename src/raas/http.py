"""HTTP helpers shared by raas' servers: one shape for validation errors, a uvicorn runner."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


async def validation_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 whose ``detail`` names each bad field as a dotted path, e.g. ``body.sampling.temperature``."""
    errors = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e.get("loc", ()))
        errors.append({"field": loc, "message": e.get("msg", "invalid")})
    summary = "; ".join(f"{x['field']}: {x['message']}" for x in errors)
    return JSONResponse(status_code=422, content={"detail": summary, "errors": errors})
