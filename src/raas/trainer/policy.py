"""The trainable policy: a causal LM (optionally with LoRA adapters) and its token log-probs.

``token_logprobs`` is where training time goes, so it avoids two kinds of waste:

* samples that share a prefix (all n samples of a group share the prompt, often more) run that
  prefix through the model once; its keys/values are repeated across the rows *with* autograd, so
  the gradient through the shared prompt is exact, not approximated;
* the vocabulary projection (a fifth of SmolLM2's weights) runs only at the positions whose next
  token is sampled, not at every prompt position.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch

from raas import models
from raas.tokenseq import common_prefix_len

log = logging.getLogger(__name__)
_MIN_SHARED_PREFIX = 8


class Policy:
    def __init__(
        self,
        model_dir: str | Path,
        *,
        device: str = "cpu",
        lora_rank: int = 0,
        lora_alpha: float = 32.0,
        lora_targets: list[str] | None = None,
        lora_top_layers: int | None = None,
    ):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=models.dtype_for(device)).to(device)
        model.config.use_cache = True
        self.device = device
        self.lora_rank = lora_rank
        self.lora_scale = lora_alpha / lora_rank if lora_rank else 1.0
        if lora_rank:
            from peft import LoraConfig, get_peft_model

            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")  # peft vs transformers 5

            targets = lora_targets or ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
            n_layers = model.config.num_hidden_layers
            layers = list(range(n_layers - lora_top_layers, n_layers)) if lora_top_layers else None
            cfg = LoraConfig(
                r=lora_rank, lora_alpha=lora_alpha, target_modules=targets, lora_dropout=0.0, bias="none",
                layers_to_transform=layers,
            )
            self.model = get_peft_model(model, cfg)
            self.lm = self.model.get_base_model()
        else:
            self.model = self.lm = model
        self.model.train()

    def parameters(self):
        return [p for p in self.model.parameters() if p.requires_grad]

    # ------------------------------------------------------------------ log-probs
    def token_logprobs(self, seqs: list[list[int]], positions: list[list[int]]) -> list[torch.Tensor]:
        """For each sequence, log p(seq[i] | seq[:i]) at each ``i`` in its ``positions`` (i >= 1)."""
        from transformers import DynamicCache

        dev = self.device
        B = len(seqs)
        decoder, head = self.lm.get_decoder(), self.lm.get_output_embeddings()
        P = common_prefix_len(seqs) if B > 1 else 0
        P = min(P, min(len(s) for s in seqs) - 1)
        if P < _MIN_SHARED_PREFIX:
            P = 0
        cache = DynamicCache(config=self.lm.config)
        h_pre = None
        if P:
            h_pre = decoder(input_ids=torch.tensor([seqs[0][:P]], device=dev), cache=cache, use_cache=True).last_hidden_state
            if B > 1:
                cache.batch_repeat_interleave(B)
        S = max(len(s) - P for s in seqs)
        ids = torch.zeros((B, S), dtype=torch.long, device=dev)
        attn = torch.zeros((B, P + S), dtype=torch.long, device=dev)
        attn[:, :P] = 1
        for b, s in enumerate(seqs):
            n = len(s) - P
            ids[b, :n] = torch.tensor(s[P:], device=dev)
            attn[b, P : P + n] = 1
        pos = torch.arange(P, P + S, device=dev).expand(B, S)
        h_suf = decoder(input_ids=ids, attention_mask=attn, position_ids=pos, cache=cache, use_cache=True).last_hidden_state

        # Gather the hidden states that predict each wanted token with one advanced-indexing op
        # per part (per-position indexing would give autograd one dense gradient per position).
        pre_j, suf_b, suf_j, order_pre, order_suf, targets, counts = [], [], [], [], [], [], []
        k = 0
        for b, (s, ps) in enumerate(zip(seqs, positions)):
            for i in ps:
                j = i - 1  # the hidden state at j predicts token i
                if j < P:
                    pre_j.append(j)
                    order_pre.append(k)
                else:
                    suf_b.append(b)
                    suf_j.append(j - P)
                    order_suf.append(k)
                targets.append(s[i])
                k += 1
            counts.append(len(ps))
        if not targets:
            return [torch.zeros(0, device=dev) for _ in seqs]
        parts, order = [], []
        if pre_j:
            parts.append(h_pre[0, torch.tensor(pre_j, device=dev)])
            order += order_pre
        if suf_j:
            parts.append(h_suf[torch.tensor(suf_b, device=dev), torch.tensor(suf_j, device=dev)])
            order += order_suf
        hidden = torch.cat(parts) if len(parts) > 1 else parts[0]
        if order != sorted(order):
            hidden = hidden[torch.argsort(torch.tensor(order, device=dev))]
        logits = head(hidden).float()
        logp = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(targets, device=dev)[:, None])[:, 0]
        return list(torch.split(logp, counts))

    # ------------------------------------------------------------------ publishing
    @torch.no_grad()
    def export(self, path: str | Path) -> tuple[str, float]:
        """Write what the inference engine needs to follow this policy; returns (format, lora_scale).

        LoRA: ``<module>.lora_A`` / ``<module>.lora_B`` per adapted module (a few MB), merged by the
        engine as ``W_base + scale * B @ A``. Full: every trainable parameter by its model name.
        """
        from safetensors.torch import save_file

        tensors: dict[str, torch.Tensor] = {}
        if self.lora_rank:
            for name, mod in self.lm.named_modules():
                if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {}):
                    tensors[f"{name}.lora_A"] = mod.lora_A["default"].weight.detach().float().cpu().contiguous()
                    tensors[f"{name}.lora_B"] = mod.lora_B["default"].weight.detach().float().cpu().contiguous()
            fmt = "lora"
        else:
            tensors = {n: p.detach().cpu().contiguous() for n, p in self.lm.named_parameters()}
            fmt = "full"
        tmp = Path(str(path) + ".tmp")
        save_file(tensors, str(tmp))
        tmp.replace(path)
        return fmt, self.lora_scale

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in self.model.named_parameters() if p.requires_grad}

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for n, t in sd.items():
                params[n].copy_(t)
