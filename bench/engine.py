"""``raas bench engine``: embedded-engine generation throughput, side by side in one run.

Over HTTP (``POST /v1/generate``) against a fresh ``raas engine`` process, the calculator task's
real prompt (three worked examples + a question, ~350 tokens), temperature 1, up to
``--max-tokens`` tokens per request:

* concurrency 1, 8 and 16 (each client sends its next request as soon as one returns);
* for reference, plain transformers ``generate`` in-process, one sequence at a time and one
  padded batch of 8, on the same prompts and budget.

Reports output tokens per second, the median request latency, and each row's ratio to the
engine at concurrency 1.

Usage: python bench/engine.py [--model DIR] [--threads N] [--requests N] [--max-tokens N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import httpx
from rich.console import Console
from rich.table import Table

from raas import models
from raas.agent.chat import ChatRenderer
from raas.envs.calculator import CalculatorEnv
from raas.launch import EngineProcess


def prompts(model_dir, n: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    env, out = CalculatorEnv(), []
    for seed in range(n):
        ep = asyncio.run(env.init({"seed": seed}))
        out.append(ChatRenderer(tok).render(ep.messages, []))
    return out


async def engine_run(url: str, ps: list[list[int]], concurrency: int, max_tokens: int) -> dict:
    lat: list[float] = []
    tokens = 0
    it = iter(enumerate(ps))

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal tokens
        for i, p in it:
            t0 = time.perf_counter()
            r = await http.post("/v1/generate", json={"prompt_token_ids": p, "sampling": {"max_tokens": max_tokens, "seed": i}})
            r.raise_for_status()
            lat.append(time.perf_counter() - t0)
            tokens += len(r.json()["output_token_ids"])

    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "p50_s": statistics.median(lat)}


def hf_run(model_dir, ps: list[list[int]], batch: int, max_tokens: int, threads: int | None) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if threads:
        torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokens, lat = 0, []
    t0 = time.perf_counter()
    for i in range(0, len(ps), batch):
        chunk = ps[i : i + batch]
        L = max(len(p) for p in chunk)
        ids = torch.tensor([[tok.pad_token_id] * (L - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in chunk])
        t1 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=True,
                                 temperature=1.0, top_p=1.0, top_k=0, pad_token_id=tok.pad_token_id)
        lat.append(time.perf_counter() - t1)
        for row in out[:, L:].tolist():
            n = len(row)
            for j, t in enumerate(row):
                if t == tok.eos_token_id:
                    n = j + 1
                    break
            tokens += n
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "p50_s": statistics.median(lat)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="raas bench engine", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="SmolLM2-135M-Instruct")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (engine and reference)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    model_dir = models.prepare(a.model)
    ps = prompts(model_dir, a.requests)
    console = Console(width=140)
    rows: dict[str, dict] = {}
    with EngineProcess(model_dir, threads=a.threads) as eng:
        asyncio.run(engine_run(eng.url, ps[:2], 2, 4))  # warm-up
        for c in (1, 8, 16):
            rows[f"raas engine, {c} concurrent"] = asyncio.run(engine_run(eng.url, ps, c, a.max_tokens))
    n_ref = min(len(ps), 16)
    rows["transformers generate, 1 at a time"] = hf_run(model_dir, ps[:n_ref], 1, a.max_tokens, a.threads)
    rows["transformers generate, padded batch of 8"] = hf_run(model_dir, ps[:n_ref], 8, a.max_tokens, a.threads)
    base = rows["raas engine, 1 concurrent"]["tok_s"]
    t = Table(title=f"generation throughput: {model_dir.name}, prompt ~{len(ps[0])} tokens, <= {a.max_tokens} new, T=1")
    for col in ("method", "requests", "tokens", "wall s", "tok/s", "p50 latency s", "x engine@1"):
        t.add_column(col, justify="right" if col != "method" else "left")
    for name, r in rows.items():
        n = a.requests if name.startswith("raas") else n_ref
        t.add_row(name, str(n), str(r["tokens"]), f"{r['wall_s']:.1f}", f"{r['tok_s']:.1f}", f"{r['p50_s']:.2f}", f"{r['tok_s'] / base:.2f}")
    console.print(t)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
