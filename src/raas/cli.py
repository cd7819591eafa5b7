"""``raas`` command line: serve | engine | model | train | bench | report.

Each subcommand parses its arguments, builds its part and runs it; the logic lives in the parts.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path


def _engine(a: argparse.Namespace) -> int:
    import uvicorn

    from raas import models
    from raas.engine.core import Engine
    from raas.engine.server import create_app

    device = a.device or ("cuda" if _cuda() else "cpu")
    engine = Engine(models.prepare(a.model), device=device, max_batch=a.max_batch, threads=a.threads)
    uvicorn.run(create_app(engine), host=a.host, port=a.port, log_level=a.log_level, timeout_graceful_shutdown=5)
    return 0


def _serve(a: argparse.Namespace) -> int:
    import uvicorn

    from raas.contracts import Stage
    from raas.launch import EngineProcess
    from raas.service.app import create_app

    from raas import models
    from transformers import AutoTokenizer

    model_dir = models.prepare(a.model)
    llms, proc = list(a.llm or []), None
    if not llms:
        proc = EngineProcess(model_dir, threads=a.engine_threads, log_path=a.engine_log).start()
        llms = [proc.url]
        print(f"raas: started the embedded engine at {proc.url}", file=sys.stderr)
    try:
        app = create_app(
            AutoTokenizer.from_pretrained(model_dir),
            llms,
            max_model_len=a.max_model_len,
            state_dir=a.state_dir,
            workers={Stage.init: a.init_workers, Stage.run: a.run_workers, Stage.eval: a.eval_workers},
        )
        uvicorn.run(app, host=a.host, port=a.port, log_level=a.log_level, timeout_graceful_shutdown=5)
    finally:
        if proc is not None:
            proc.stop()
    return 0


def _model(a: argparse.Namespace) -> int:
    from raas import models

    if a.action == "prepare":
        print(models.prepare(a.name))
    else:
        print(models.tiny(a.out_dir))
    return 0


def _train(a: argparse.Namespace) -> int:
    from raas.coordinator.config import ConfigError, load_config
    from raas.coordinator.run import run_training

    try:
        cfg = load_config(a.config, a.set or [])
    except ConfigError as e:
        print(f"raas train: {e}", file=sys.stderr)
        return 2
    return run_training(cfg)


def _bench(a: argparse.Namespace) -> int:
    root = Path(__file__).resolve().parents[2]
    if not (root / "bench").is_dir():
        print("raas bench: the bench/ folder ships with the source tree; run from a checkout", file=sys.stderr)
        return 2
    sys.path.insert(0, str(root))
    import importlib

    mod = importlib.import_module(f"bench.{a.suite}")
    return int(mod.main(a.args) or 0)


def _report(a: argparse.Namespace) -> int:
    from raas.coordinator.report import report

    return report(Path(a.run_dir))


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raas", description="Rollout-as-a-Service for RL training of LLM agents")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="cmd", required=True)

    e = sub.add_parser("engine", help="embedded inference server (token-in/token-out + OpenAI subset)")
    e.add_argument("--model", default="SmolLM2-135M-Instruct", help="HF model directory or the default model's name")
    e.add_argument("--host", default="127.0.0.1")
    e.add_argument("--port", type=int, default=8100)
    e.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when present")
    e.add_argument("--max-batch", type=int, default=64, help="most requests batched into one forward pass")
    e.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    e.add_argument("--log-level", default="warning")
    e.set_defaults(fn=_engine)

    s = sub.add_parser("serve", help="rollout service (INIT/RUN/EVAL over HTTP)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--llm", action="append", help="inference server URL (repeatable); none = start the embedded engine")
    s.add_argument("--model", default="SmolLM2-135M-Instruct", help="model directory (its tokenizer renders chats)")
    s.add_argument("--state-dir", default=None, help="journal directory: accepted jobs and results survive restarts")
    s.add_argument("--max-model-len", type=int, default=8192)
    s.add_argument("--init-workers", type=int, default=8)
    s.add_argument("--run-workers", type=int, default=64)
    s.add_argument("--eval-workers", type=int, default=8)
    s.add_argument("--engine-threads", type=int, default=None)
    s.add_argument("--engine-log", default=None, help="file for the embedded engine's output")
    s.add_argument("--log-level", default="warning")
    s.set_defaults(fn=_serve)

    m = sub.add_parser("model", help="prepare model directories")
    msub = m.add_subparsers(dest="action", required=True)
    mp = msub.add_parser("prepare", help="print the local HF directory of a model, building it once")
    mp.add_argument("name", nargs="?", default="SmolLM2-135M-Instruct")
    mt = msub.add_parser("tiny", help="write a tiny random model with the real tokenizer, for tests")
    mt.add_argument("out_dir")
    m.set_defaults(fn=_model)

    t = sub.add_parser("train", help="RL training run from a TOML config")
    t.add_argument("config")
    t.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value, e.g. trainer.lr=1e-5")
    t.set_defaults(fn=_train)

    b = sub.add_parser("bench", help="benchmarks (figures go to docs/benchmarks.md)")
    b.add_argument("suite", choices=["engine", "tools"])
    b.add_argument("args", nargs=argparse.REMAINDER)
    b.set_defaults(fn=_bench)

    r = sub.add_parser("report", help="summary and plots of a training run")
    r.add_argument("run_dir")
    r.set_defaults(fn=_report)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # SIGTERM unwinds like Ctrl-C, so child processes and files are cleaned up on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from raas.models import ModelError

    try:
        return args.fn(args)
    except ModelError as e:
        print(f"raas {args.cmd}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
