"""The embedded engine over real HTTP with a tiny real transformer."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch
from safetensors.torch import save_file

from raas.engine.core import Engine
from raas.engine.server import create_app
from tests.conftest import ServerThread


@pytest.fixture
def served(tiny_model):
    """A fresh engine per test (weight updates must not leak between tests)."""
    engine = Engine(tiny_model, max_batch=16, threads=1)
    with ServerThread(create_app(engine)) as srv:
        yield engine, srv.url
    engine.close()


@pytest.fixture(scope="module")
def reference(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def ref_logprobs(model, prompt, output):
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([prompt + output])).logits[0].float(), -1)
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(output)]


async def generate_many(url, bodies):
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        rs = await asyncio.gather(*(c.post("/v1/generate", json=b) for b in bodies))
    for r in rs:
        assert r.status_code == 200, r.text
    return [r.json() for r in rs]


def test_logprobs_equal_the_models_own_log_softmax(served, reference):
    engine, url = served
    shared = list(range(100, 140))  # a shared prefix, then suffixes of different lengths
    prompts = [shared + list(range(500, 500 + k)) for k in (1, 5, 13)] + [list(range(900, 920))]
    bodies = [{"prompt_token_ids": p, "sampling": {"temperature": 1.0, "max_tokens": 12, "seed": i}} for i, p in enumerate(prompts)]
    outs = asyncio.run(generate_many(url, bodies))
    for p, o in zip(prompts, outs):
        assert len(o["output_token_ids"]) == len(o["logprobs"]) >= 1
        ref = ref_logprobs(reference, p, o["output_token_ids"])
        assert max(abs(a - b) for a, b in zip(ref, o["logprobs"])) < 1e-4
        assert o["version"] == 0 and o["finish_reason"] in ("stop", "length")


def test_concurrent_requests_are_batched_and_sampling_is_per_request(served, reference):
    engine, url = served
    prompt = list(range(200, 230))
    bodies = [{"prompt_token_ids": prompt, "sampling": {"temperature": 1.0, "max_tokens": 8, "seed": 1}} for _ in range(6)]
    bodies += [{"prompt_token_ids": prompt, "sampling": {"temperature": 0.0, "max_tokens": 8}} for _ in range(2)]
    before = dict(engine.stats)
    outs = asyncio.run(generate_many(url, bodies))
    assert engine.stats["requests"] - before["requests"] == 8
    assert engine.stats["max_active"] >= 2  # several requests shared forward passes
    tokens = sum(len(o["output_token_ids"]) for o in outs)
    assert engine.stats["steps"] - before["steps"] < tokens
    seeded = [o["output_token_ids"] for o in outs[:6]]
    assert all(s == seeded[0] for s in seeded)  # same seed, same sample, even inside one batch
    greedy = outs[6]["output_token_ids"]
    assert outs[7]["output_token_ids"] == greedy
    with torch.no_grad():  # greedy really is the argmax, step by step
        seq = list(prompt)
        for t in greedy:
            assert int(reference(torch.tensor([seq])).logits[0, -1].argmax()) == t
            seq.append(t)


def test_full_weight_update_bumps_version_and_changes_outputs(served, tmp_path):
    engine, url = served
    body = {"prompt_token_ids": list(range(300, 320)), "sampling": {"temperature": 0.0, "max_tokens": 8}}
    before = asyncio.run(generate_many(url, [body]))[0]
    emb = engine.model.get_input_embeddings().weight.detach().clone()
    g = torch.Generator().manual_seed(0)
    new = {"model.embed_tokens.weight": emb + torch.randn(emb.shape, generator=g) * 0.5}
    save_file(new, str(tmp_path / "w.safetensors"))
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/v1/weights", json={"path": str(tmp_path / "w.safetensors"), "format": "full"})
        assert r.status_code == 200, r.text
        assert r.json()["version"] == 1 and r.json()["tensors"] == 1
        assert c.get("/v1/info").json()["version"] == 1
    after = asyncio.run(generate_many(url, [body]))[0]
    assert after["version"] == 1
    assert after["output_token_ids"] != before["output_token_ids"] or after["logprobs"] != before["logprobs"]


def test_lora_update_merges_onto_base_weights(served, tmp_path, reference):
    engine, url = served
    name = "model.layers.0.mlp.down_proj"
    w = dict(reference.named_parameters())[f"{name}.weight"].detach()
    a, b = torch.randn(4, w.shape[1]) * 0.1, torch.randn(w.shape[0], 4) * 0.1
    save_file({f"{name}.lora_A": a, f"{name}.lora_B": b}, str(tmp_path / "l.safetensors"))
    with httpx.Client(base_url=url, timeout=60) as c:
        for version in (5, 6):  # applied twice: merges onto the base, never accumulates
            r = c.post("/v1/weights", json={"path": str(tmp_path / "l.safetensors"), "format": "lora", "lora_scale": 2.0, "version": version})
            assert r.status_code == 200, r.text
            assert r.json()["version"] == version
    merged = dict(engine.model.named_parameters())[f"{name}.weight"].detach()
    assert torch.allclose(merged, w + 2.0 * b @ a, atol=1e-6)


def test_weight_update_errors_name_the_problem(served, tmp_path):
    engine, url = served
    save_file({"no.such.weight": torch.zeros(2)}, str(tmp_path / "bad.safetensors"))
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/v1/weights", json={"path": str(tmp_path / "missing.safetensors")})
        assert r.status_code == 400 and "no such file" in r.json()["detail"]
        r = c.post("/v1/weights", json={"path": str(tmp_path / "bad.safetensors")})
        assert r.status_code == 400 and "no.such.weight" in r.json()["detail"]
        assert c.get("/v1/info").json()["version"] == 0  # nothing half-applied


def test_bad_requests_get_4xx_naming_the_field(served):
    engine, url = served
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/v1/generate", json={"prompt_token_ids": [1, 2], "sampling": {"temperature": -1}})
        assert r.status_code == 422 and "sampling.temperature" in r.json()["detail"]
        r = c.post("/v1/generate", json={"prompt_token_ids": []})
        assert r.status_code == 422 and "prompt_token_ids" in r.json()["detail"]
        r = c.post("/v1/generate", json={"prompt_token_ids": [10**9]})
        assert r.status_code == 400 and "outside the vocabulary" in r.json()["detail"]
        r = c.post("/v1/generate", json={"prompt_token_ids": [5] * (engine.max_model_len + 1)})
        assert r.status_code == 400 and "context" in r.json()["detail"]


def test_openai_client_works_against_the_engine(served):
    import openai

    engine, url = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    models = client.models.list()
    assert len(models.data) == 1
    chat = client.chat.completions.create(
        model=models.data[0].id, messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0, logprobs=True
    )
    assert isinstance(chat.choices[0].message.content, str)
    assert len(chat.choices[0].logprobs.content) == chat.usage.completion_tokens <= 5
    comp = client.completions.create(model=models.data[0].id, prompt=[1, 2, 3, 4], max_tokens=4, logprobs=1, n=2, seed=3)
    assert len(comp.choices) == 2
    assert all(len(ch.logprobs.token_logprobs) <= 4 for ch in comp.choices)


def test_rows_joining_a_running_batch_stay_exact(tiny_model, reference):
    """Continuous batching: requests admitted at different decode steps, with different prompt
    lengths and budgets, each get exactly the log-probs of an unpadded run."""
    import random

    from raas.contracts import SamplingParams
    from raas.engine.generator import Generator, GenRequest

    gen = Generator(reference, [2], 4096)
    rng = random.Random(0)
    reqs = [
        GenRequest([rng.randrange(40000) for _ in range(rng.randint(3, 40))], SamplingParams(max_tokens=rng.randint(3, 20), seed=i))
        for i in range(8)
    ]
    done = gen.admit(reqs[:3])
    for r in reqs[3:]:
        done += gen.step()
        done += gen.admit([r])
    while gen.active:
        done += gen.step()
    assert sorted(id(r) for r, _ in done) == sorted(id(r) for r in reqs)
    for req, res in done:
        assert len(res.tokens) <= req.sampling.max_tokens
        ref = ref_logprobs(reference, req.prompt, res.tokens)
        assert max(abs(a - b) for a, b in zip(ref, res.logprobs)) < 1e-4


def test_next_turn_reuses_the_cached_conversation_exactly(tiny_model, reference):
    """A request that continues a finished one (its prompt + output + a tool result) prefills
    only the new tail from the prefix cache, with the same log-probs as an uncached run; a weight
    update empties the cache."""
    import random

    from raas.contracts import SamplingParams
    from raas.engine.generator import Generator, GenRequest

    gen = Generator(reference, [2], 4096)
    rng = random.Random(1)
    shared = [rng.randrange(40000) for _ in range(30)]
    first = [GenRequest(shared + [rng.randrange(40000) for _ in range(5)], SamplingParams(max_tokens=8, seed=i)) for i in range(4)]
    outs = gen.generate(first)
    nxt = [GenRequest(r.prompt + o.tokens + [7, 8, 9], SamplingParams(max_tokens=8, seed=9 + i)) for i, (r, o) in enumerate(zip(first, outs))]
    hits = gen.prefix_cache.hits
    outs2 = gen.generate(nxt)
    assert gen.prefix_cache.hits - hits == 4
    for req, res in zip(nxt, outs2):
        ref = ref_logprobs(reference, req.prompt, res.tokens)
        assert max(abs(a - b) for a, b in zip(ref, res.logprobs)) < 1e-4


def test_weight_update_clears_the_prefix_cache(served, tmp_path):
    engine, url = served
    body = {"prompt_token_ids": list(range(300, 340)), "sampling": {"temperature": 0.0, "max_tokens": 4}}
    asyncio.run(generate_many(url, [body, body]))
    assert len(engine.generator.prefix_cache) > 0
    emb = engine.model.get_input_embeddings().weight.detach()
    save_file({"model.embed_tokens.weight": emb.clone()}, str(tmp_path / "w.safetensors"))
    with httpx.Client(base_url=url, timeout=60) as c:
        assert c.post("/v1/weights", json={"path": str(tmp_path / "w.safetensors")}).status_code == 200
    assert len(engine.generator.prefix_cache) == 0
