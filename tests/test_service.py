"""The rollout service over real HTTP, running real episodes against the real tiny engine."""

from __future__ import annotations

import asyncio
import time

import httpx

from raas.contracts import Stage, Trajectory
from raas.envs.base import Env, Episode
from raas.envs.registry import register
from tests.conftest import wait_done


@register
class SleepyEnv(Env):
    """A calculator-like task whose INIT takes ``delay`` seconds (like a slow sandbox start)."""

    name = "test-sleepy"
    closed: list[str] = []

    async def init(self, instance):
        await asyncio.sleep(float(instance.get("delay", 0)))
        return Episode(task_id=f"sleepy:{instance.get('delay')}", messages=[{"role": "user", "content": "hi"}])

    async def eval(self, episode, result):
        return 0.5, {"ok": True}

    async def close(self, episode):
        SleepyEnv.closed.append(episode.task_id)


BODY = {"task": {"env": "calculator", "seed": 3}, "n": 3, "sampling": {"max_tokens": 16}, "agent": {"max_turns": 2}}


def test_submit_poll_and_trajectory(make_service, tokenizer):
    svc = make_service()
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        r = c.post("/v1/rollouts", json=BODY)
        assert r.status_code == 202
        sub = r.json()
        assert len(sub["ids"]) == 3 and sub["group_id"].startswith("g-")
        first = c.get(f"/v1/rollouts/{sub['ids'][0]}").json()
        assert first["status"] in ("queued", "init", "run", "eval", "done")
        for jid in sub["ids"]:
            done = wait_done(c, jid)
            t = Trajectory.model_validate(done["trajectory"])  # invariants re-checked on the client side
            assert t.group_id == sub["group_id"] and t.env == "calculator" and t.task_id == "calculator:3"
            assert t.status.value in ("completed", "truncated") and t.num_sampled > 0
            assert set(t.sampled_versions) == {0}
            assert t.reward in (0.0, 1.0) and "correct" in t.metrics
            assert t.timing.run_s > 0
            assert sum(turn.sampled for turn in t.turns) == t.metrics["turns"] >= 1
            for turn in t.turns:
                if turn.sampled:
                    a, b = turn.span
                    assert tokenizer.decode(t.tokens[a:b], skip_special_tokens=True) == turn.text
        assert c.get("/health").json()["done"] == 3


def test_results_stream_in_completion_order_with_a_cursor(make_service):
    svc = make_service()
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        ids = c.post("/v1/rollouts", json=BODY).json()["ids"] + c.post("/v1/rollouts", json={**BODY, "n": 2}).json()["ids"]
        seen, cursor = [], 0
        deadline = time.monotonic() + 60
        while len(seen) < 5 and time.monotonic() < deadline:
            page = c.get("/v1/results", params={"after": cursor, "wait_s": 5, "limit": 2}).json()
            assert len(page["results"]) <= 2 and page["cursor"] == cursor + len(page["results"])
            cursor = page["cursor"]
            seen += [x["id"] for x in page["results"]]
        assert sorted(seen) == sorted(ids)
        # The cursor is stable: reading from 0 again gives the same order.
        again = c.get("/v1/results", params={"after": 0}).json()["results"]
        assert [x["id"] for x in again] == seen
        t0 = time.monotonic()
        empty = c.get("/v1/results", params={"after": cursor, "wait_s": 0.3}).json()
        assert empty["results"] == [] and time.monotonic() - t0 >= 0.25  # long-poll waited


def test_client_id_makes_submit_idempotent(make_service):
    svc = make_service()
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        a = c.post("/v1/rollouts", json={**BODY, "client_id": "run-1-step-0"}).json()
        b = c.post("/v1/rollouts", json={**BODY, "client_id": "run-1-step-0"}).json()
        assert a["ids"] == b["ids"] and b["duplicate"] is True
        for jid in a["ids"]:
            wait_done(c, jid)
        assert c.get("/health").json()["done"] == 3


def test_cancel_tears_down_and_reports_cancelled(make_service):
    svc = make_service()
    SleepyEnv.closed.clear()
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        jid = c.post("/v1/rollouts", json={"task": {"env": "test-sleepy", "delay": 30}}).json()["ids"][0]
        deadline = time.monotonic() + 10
        while c.get(f"/v1/rollouts/{jid}").json()["status"] != "init" and time.monotonic() < deadline:
            time.sleep(0.02)
        r = c.delete(f"/v1/rollouts/{jid}")
        assert r.status_code == 200
        done = wait_done(c, jid, 10)
        t = done["trajectory"]
        assert t["status"] == "cancelled" and t["error"]["stage"] == "init"
        assert c.delete("/v1/rollouts/r-nope").status_code == 404


def test_cancel_while_queued(make_service):
    svc = make_service(workers={Stage.init: 1, Stage.run: 1, Stage.eval: 1})
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        blocker = c.post("/v1/rollouts", json={"task": {"env": "test-sleepy", "delay": 30}}).json()["ids"][0]
        queued = c.post("/v1/rollouts", json={"task": {"env": "test-sleepy", "delay": 0}}).json()["ids"][0]
        assert c.get(f"/v1/rollouts/{queued}").json()["status"] == "queued"
        c.delete(f"/v1/rollouts/{queued}")
        t = wait_done(c, queued, 5)["trajectory"]
        assert t["status"] == "cancelled" and t["error"]["stage"] == "queue"
        c.delete(f"/v1/rollouts/{blocker}")
        assert wait_done(c, blocker, 5)["trajectory"]["status"] == "cancelled"


def test_timeout_ends_the_job_with_timeout_status(make_service):
    svc = make_service()
    SleepyEnv.closed.clear()
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        jid = c.post("/v1/rollouts", json={"task": {"env": "test-sleepy", "delay": 30}, "timeout_s": 0.3}).json()["ids"][0]
        t = wait_done(c, jid, 10)["trajectory"]
        assert t["status"] == "timeout" and t["error"]["type"] == "Timeout" and t["error"]["stage"] == "init"
        ok = c.post("/v1/rollouts", json={"task": {"env": "test-sleepy", "delay": 0}, "timeout_s": 30}).json()["ids"][0]
        t = wait_done(c, ok, 30)["trajectory"]
        assert t["status"] in ("completed", "truncated") and t["reward"] == 0.5
        assert "sleepy:0" in SleepyEnv.closed  # EVAL done, episode cleaned up


def test_unknown_env_and_malformed_bodies_get_4xx_naming_the_field(make_service):
    svc = make_service()
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        r = c.post("/v1/rollouts", json={"task": {"env": "no-such-env"}})
        assert r.status_code == 404 and "no-such-env" in r.json()["detail"] and "calculator" in r.json()["detail"]
        r = c.post("/v1/rollouts", json={"task": {"env": "calculator", "seed": 1}, "sampling": {"temperature": "hot"}})
        assert r.status_code == 422 and "body.sampling.temperature" in r.json()["detail"]
        r = c.post("/v1/rollouts", json={"task": {"env": "calculator", "seed": 1}, "n": 0})
        assert r.status_code == 422 and "body.n" in r.json()["detail"]
        r = c.post("/v1/rollouts", json={"task": {"env": "calculator"}})
        assert r.status_code == 422 and "task.seed" in r.json()["detail"]
        r = c.post("/v1/rollouts", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 422
        assert c.get("/v1/rollouts/r-missing").status_code == 404
        assert c.get("/health").json()["done"] == 0  # nothing was accepted


def test_envs_servers_policy_and_metrics(make_service, engine):
    svc = make_service()
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        envs = {e["name"]: e for e in c.get("/v1/envs").json()["envs"]}
        assert "seed" in envs["calculator"]["fields"]
        assert c.get("/v1/llm/servers").json()["servers"] == [{"url": engine.url}]
        assert c.post("/v1/llm/servers", json={"url": "ftp://x"}).status_code == 422
        assert c.delete("/v1/llm/servers", params={"url": "http://127.0.0.1:1"}).status_code == 404
        assert c.post("/v1/llm/servers", json={"url": "http://127.0.0.1:1/"}).json()["servers"][-1] == {"url": "http://127.0.0.1:1"}
        assert c.delete("/v1/llm/servers", params={"url": "http://127.0.0.1:1"}).json()["servers"] == [{"url": engine.url}]
        assert c.post("/v1/policy", json={"version": 3}).json()["version"] == 3
        assert c.get("/health").json()["policy_version"] == 3
        assert "raas_jobs_submitted" in c.get("/metrics").text


def test_failed_inference_is_reported_not_lost(make_service):
    svc = make_service(llm_urls=["http://127.0.0.1:9"])  # nothing listens there
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        jid = c.post("/v1/rollouts", json={**BODY, "n": 1}).json()["ids"][0]
        t = wait_done(c, jid, 30)["trajectory"]
        assert t["status"] == "failed" and t["error"]["stage"] == "run"
        assert "every inference server failed" in t["error"]["message"]


def test_journal_survives_a_restart(make_service, tmp_path):
    svc = make_service(state_dir=str(tmp_path))
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        done_ids = c.post("/v1/rollouts", json={**BODY, "n": 2, "client_id": "a"}).json()["ids"]
        for jid in done_ids:
            wait_done(c, jid)
        order = [x["id"] for x in c.get("/v1/results", params={"after": 0}).json()["results"]]
        assert sorted(order) == sorted(done_ids)
        pending = c.post("/v1/rollouts", json={"task": {"env": "test-sleepy", "delay": 30}, "client_id": "b"}).json()["ids"]
    svc.__exit__(None, None, None)  # stop the first service while 'b' is still in INIT
    svc2 = make_service(state_dir=str(tmp_path))
    with httpx.Client(base_url=svc2.url, timeout=30) as c:
        page = c.get("/v1/results", params={"after": 0}).json()
        assert [x["id"] for x in page["results"]] == order  # results kept, same order
        again = c.post("/v1/rollouts", json={"task": {"env": "test-sleepy", "delay": 30}, "client_id": "b"}).json()
        assert again["ids"] == pending and again["duplicate"]
        assert c.get(f"/v1/rollouts/{pending[0]}").json()["status"] in ("queued", "init")  # re-run, not lost
