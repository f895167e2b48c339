"""The benchmark's reference: Hugging Face's training step of the same family
(``XLMRobertaForMaskedLM`` or ``ModernBertForMaskedLM``).

Same encoder configuration, batch and masked positions as our step (labels -100
elsewhere); AdamW with RoBERTa's betas/eps/decay and no decay on biases and
LayerNorms, gradient clipping at 1.0, dropout as configured; bf16 through autocast
(fp32 weights) when the model's dtype is bfloat16, as HF's Trainer does. HF
computes the LM head at every position. torch and transformers are imported only
when a run is built.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from xlmeta_jax.data import feeding
from xlmeta_jax.interop.hf import families
from xlmeta_jax.model.network import EncoderConfig
from xlmeta_jax.pretrain import hardware
from xlmeta_jax.tools import timing


def hf_available() -> bool:
    """True when torch and transformers import."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


class HFRun(timing.TimedRun):
    """HF's training step for ``cfg`` at ``batch x length``: built, run once and warmed
    up on construction; :meth:`time_steps` times further steps; :meth:`summary` reports."""

    def __init__(self, cfg: EncoderConfig, *, batch: int, length: int, warmup: int, seed: int,
                 compile: bool = False, attn_implementation: str = "sdpa"):
        import torch  # noqa: PLC0415 - optional: PyTorch only for this
        import transformers  # noqa: PLC0415 - optional: transformers only for this

        self.cfg, self.batch, self.length = cfg, batch, length
        self.compile, self.attn = compile, attn_implementation
        self.torch = torch
        self.framework = f"transformers {transformers.__version__}, torch {torch.__version__}"
        self.device = device = "cuda" if torch.cuda.is_available() else "cpu"
        self.autocast = cfg.dtype == "bfloat16"
        torch.manual_seed(seed)
        layout = families.of(cfg)
        hf_cfg = getattr(transformers, layout.CONFIG_CLASS)(
            **layout.export_config(cfg, None, {}))
        model_class = getattr(transformers, layout.ARCHITECTURE)
        model = model_class._from_config(
            hf_cfg, attn_implementation=attn_implementation
        ).to(device).train()
        decay, no_decay = [], []
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name.lower():
                no_decay.append(p)
            else:
                decay.append(p)
        self.model = model
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
            lr=1e-4, betas=(0.9, 0.98), eps=1e-6,
        )
        host = feeding.mlm_batch(np.random.default_rng(seed), batch, length, cfg.vocab_size)
        self.slots = host["mlm_positions"].shape[1]
        self.ids = torch.from_numpy(host["inputs"].astype(np.int64)).to(device)
        self.labels = torch.from_numpy(
            np.where(host["weights"] > 0, host["targets"], -100).astype(np.int64)
        ).to(device)
        self.mask = torch.ones_like(self.ids)
        self.forward = torch.compile(model) if compile else model
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        self._run(1)
        self.first_step_s = time.perf_counter() - t0
        self._run(warmup)
        if device == "cuda":
            self.memory = (torch.cuda.max_memory_allocated(), "torch.cuda.max_memory_allocated")
        else:
            self.memory = (timing.max_rss_bytes(),
                           "process max RSS (host; includes the JAX runs)")

    def _run(self, n: int) -> None:
        torch = self.torch
        for _ in range(n):
            with torch.autocast(device_type=self.device, dtype=torch.bfloat16,
                                enabled=self.autocast):
                loss = self.forward(
                    input_ids=self.ids, attention_mask=self.mask, labels=self.labels
                ).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.loss = loss
        if self.device == "cuda":
            torch.cuda.synchronize()

    def summary(self, step_time: float) -> dict[str, Any]:
        """The run's figures at ``step_time`` seconds per step."""
        tokens = self.batch * self.length
        # HF's own computation: LM head at every position.
        flops_per_token = hardware.mlm_flops_per_token(
            self.cfg, self.length, self.slots, masked_head=False
        )
        return {
            "framework": self.framework,
            "model_class": type(self.model).__name__,
            "device": self.device,
            "compile": self.compile,
            "attn_implementation": self.attn,
            "torch_threads": self.torch.get_num_threads(),
            "first_step_s": self.first_step_s,
            "step_time_s": step_time,
            "tokens_per_s": tokens / step_time,
            "flops_per_token": flops_per_token,
            "lm_head_counted_at": "all positions",
            "model_tflops_per_s": flops_per_token * tokens / step_time / 1e12,
            "peak_memory_bytes": int(self.memory[0]),
            "peak_memory_source": self.memory[1],
            "loss": timing.check_finite(float(self.loss.detach()), "HF run"),
        }
