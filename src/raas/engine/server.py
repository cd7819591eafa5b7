"""HTTP front of the embedded engine (FastAPI).

Native, token-in/token-out: ``POST /v1/generate`` and ``POST /v1/weights``; ``GET /v1/info``.
OpenAI-compatible subset: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi import FastAPI, HTTPException
from fastapi.exceptions import RequestValidationError

from raas.contracts import (
    EngineInfo,
    GenerateRequest,
    GenerateResponse,
    SamplingParams,
    WeightUpdateRequest,
    WeightUpdateResponse,
)
from raas.engine.core import Engine, WeightError
from raas.engine.openai_api import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from raas.http import validation_handler


def create_app(engine: Engine) -> FastAPI:
    app = FastAPI(title="raas engine", version="v1")
    app.add_exception_handler(RequestValidationError, validation_handler)
    name = engine.model_dir.rstrip("/").rsplit("/", 1)[-1]

    def check_len(ids: list[int]) -> None:
        if len(ids) >= engine.max_model_len:
            raise HTTPException(400, f"prompt: {len(ids)} tokens, the model's context is {engine.max_model_len}")
        vocab = engine.model.config.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise HTTPException(400, f"prompt_token_ids: {bad} is outside the vocabulary [0, {vocab})")

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "version": engine.version}

    @app.get("/v1/info", response_model=EngineInfo)
    async def info() -> EngineInfo:
        return EngineInfo(
            model=name,
            version=engine.version,
            device=engine.device,
            max_model_len=engine.max_model_len,
            eos_token_ids=engine.eos_token_ids,
        )

    @app.get("/v1/models", response_model=ModelList)
    async def list_models() -> ModelList:
        return ModelList(data=[ModelCard(id=name, max_model_len=engine.max_model_len)])

    @app.post("/v1/generate", response_model=GenerateResponse)
    async def generate(req: GenerateRequest) -> GenerateResponse:
        check_len(req.prompt_token_ids)
        return await engine.generate(req.prompt_token_ids, req.sampling)

    @app.post("/v1/weights", response_model=WeightUpdateResponse)
    async def update_weights(req: WeightUpdateRequest) -> WeightUpdateResponse:
        try:
            return await engine.update_weights(req)
        except WeightError as e:
            raise HTTPException(400, str(e)) from None

    def sampling(req, max_default: int = 16) -> SamplingParams:
        return SamplingParams(
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            max_tokens=req.max_completion_tokens or req.max_tokens or max_default,
            seed=req.seed,
        )

    async def sample_n(prompt: list[int], sp: SamplingParams, n: int) -> list[GenerateResponse]:
        seeds = [None if sp.seed is None else sp.seed + i for i in range(n)]
        return await asyncio.gather(*(engine.generate(prompt, sp.model_copy(update={"seed": s})) for s in seeds))

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> dict:
        tok = engine.tokenizer
        p = req.prompt
        prompts: list[list[int]]
        if isinstance(p, str):
            prompts = [tok.encode(p, add_special_tokens=False)]
        elif p and isinstance(p[0], int):
            prompts = [list(p)]
        elif p and isinstance(p[0], str):
            prompts = [tok.encode(s, add_special_tokens=False) for s in p]
        else:
            prompts = [list(x) for x in p]
        if not prompts or any(not x for x in prompts):
            raise HTTPException(400, "prompt: must not be empty")
        for x in prompts:
            check_len(x)
        sp = sampling(req)
        choices = []
        usage_p = usage_c = 0
        for ids in prompts:
            outs = await sample_n(ids, sp, req.n)
            usage_p += len(ids) * req.n
            for o in outs:
                usage_c += len(o.output_token_ids)
                text = tok.decode(o.output_token_ids, skip_special_tokens=True)
                ch = {
                    "index": len(choices),
                    "text": (tok.decode(ids) if req.echo else "") + text,
                    "finish_reason": o.finish_reason,
                    "token_ids": o.output_token_ids,
                    "prompt_token_ids": ids,
                    "policy_version": o.version,
                    "logprobs": None,
                }
                if req.logprobs is not None:
                    ch["logprobs"] = {
                        "tokens": [tok.decode([t]) for t in o.output_token_ids],
                        "token_logprobs": o.logprobs,
                        "top_logprobs": None,
                        "text_offset": None,
                    }
                choices.append(ch)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": name,
            "choices": choices,
            "usage": {"prompt_tokens": usage_p, "completion_tokens": usage_c, "total_tokens": usage_p + usage_c},
        }

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest) -> dict:
        from raas.agent.parsing import parse_tool_calls

        tok = engine.tokenizer
        msgs = [m.model_dump(exclude_none=True) for m in req.messages]
        try:
            ids = tok.apply_chat_template(
                msgs, tools=req.tools, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except Exception as e:
            raise HTTPException(400, f"messages: the chat template cannot render them ({e})") from None
        check_len(ids)
        outs = await sample_n(list(ids), sampling(req, max_default=256), req.n)
        choices = []
        for i, o in enumerate(outs):
            text = tok.decode(o.output_token_ids, skip_special_tokens=True)
            parsed = parse_tool_calls(text)
            msg: dict = {"role": "assistant", "content": parsed.content if parsed.calls else text}
            if parsed.calls:
                msg["tool_calls"] = [
                    {
                        "id": f"call_{uuid.uuid4().hex[:12]}",
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                    }
                    for c in parsed.calls
                ]
            ch = {
                "index": i,
                "message": msg,
                "finish_reason": "tool_calls" if parsed.calls else o.finish_reason,
                "logprobs": None,
            }
            if req.logprobs:
                ch["logprobs"] = {
                    "content": [
                        {"token": tok.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                        for t, lp in zip(o.output_token_ids, o.logprobs)
                    ]
                }
            choices.append(ch)
        n_c = sum(len(o.output_token_ids) for o in outs)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": name,
            "choices": choices,
            "usage": {"prompt_tokens": len(ids) * req.n, "completion_tokens": n_c, "total_tokens": len(ids) * req.n + n_c},
        }

    @app.on_event("shutdown")
    async def _close() -> None:
        engine.close()

    return app
