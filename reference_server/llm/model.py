"""The decoder: a small GPT-style transformer with random weights, and its attention over a
paged KV cache.

Tokens are bytes (:func:`encode`, :func:`decode`): vocabulary 256, nothing to download, and a
text of n ASCII characters is n tokens. The weights come from ``seed``, so every process
that builds the model gets the same one.

A step runs every scheduled sequence's new tokens as one flat batch (vLLM's layout): the
linear layers see all of them at once; attention is per sequence, its queries against the
keys and values of its whole context, gathered from the blocks its block table names
(:class:`PagedKV`). :meth:`TinyDecoder.dense_logits` computes the same function without any
cache, over the whole sequence, to check the paged path against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256


def encode(text: str) -> list[int]:
    """Token ids of ``text``: its UTF-8 bytes."""
    return list(text.encode("utf-8"))


def decode(token: int) -> str:
    """One token's text: its byte as a Latin-1 character (every token is one character)."""
    return chr(token)


@dataclass(frozen=True)
class DecoderConfig:
    """The decoder's shape. ``dtype``: float32, or float64 (tests: bit-stable argmax)."""

    width: int = 128
    layers: int = 2
    heads: int = 4
    ffn: int = 512
    max_model_len: int = 2048
    seed: int = 0
    dtype: str = "float32"

    def __post_init__(self):
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not a multiple of heads {self.heads}")
        for name in ("width", "layers", "heads", "ffn", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.dtype not in ("float32", "float64", "float16", "bfloat16"):
            raise ValueError(f"dtype must be float32, float64, float16 or bfloat16, not {self.dtype!r}")

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values a token holds: 2 · layers · heads · head dim · dtype bytes."""
        return 2 * self.layers * self.width * torch.finfo(self.torch_dtype).bits // 8


class PagedKV:
    """Keys and values of ``num_blocks`` blocks of ``block_size`` tokens, per layer: one
    flat slot per token, slot ``block · block_size + offset``."""

    def __init__(self, cfg: DecoderConfig, num_blocks: int, block_size: int, device: torch.device | str = "cpu"):
        shape = (cfg.layers, num_blocks * block_size, cfg.heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=cfg.torch_dtype, device=device)
        self.v = torch.zeros(shape, dtype=cfg.torch_dtype, device=device)
        self.block_size = block_size

    def slots(self, table: list[int], start: int, end: int) -> list[int]:
        """The slots of positions ``start .. end - 1`` of a sequence with block table ``table``."""
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]


@dataclass
class Scheduled:
    """One sequence in a step: its ``n`` new tokens sit at ``start`` in the flat batch after
    ``context`` tokens already in the cache; ``slots``: the cache slots of all its
    ``context + n`` positions; ``sample``: whether the step samples its next token."""

    start: int
    n: int
    context: int
    slots: torch.Tensor
    sample: bool


class _Layer(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.width)
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.ln2 = nn.LayerNorm(cfg.width)
        self.fc1 = nn.Linear(cfg.width, cfg.ffn)
        self.fc2 = nn.Linear(cfg.ffn, cfg.width)


class TinyDecoder(nn.Module):
    """A pre-norm decoder with learned positions and a tied output head."""

    def __init__(self, cfg: DecoderConfig, device: torch.device | str = "cpu"):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(VOCAB, cfg.width)
        self.pos = nn.Embedding(cfg.max_model_len, cfg.width)
        self.layers = nn.ModuleList(_Layer(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.width)
        g = torch.Generator().manual_seed(cfg.seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif p.dim() > 1:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02 * (3.0 if "embed" in name else 1.0))
        self.to(device=device, dtype=cfg.torch_dtype)
        self.eval()

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def _mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        return layer.fc2(F.gelu(layer.fc1(layer.ln2(x))))

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor, seqs: list[Scheduled], kv: PagedKV) -> torch.Tensor:
        """One engine step over the flat batch ``tokens`` at ``positions``: writes their keys
        and values into the cache and returns the logits of the sequences that sample (in
        the order of ``seqs``)."""
        cfg = self.cfg
        n_tok = len(tokens)
        x = self.embed(tokens) + self.pos(positions)
        new = torch.cat([s.slots[s.context :] for s in seqs])  # the new tokens' slots, in batch order
        scale = 1.0 / math.sqrt(cfg.head_dim)
        for li, layer in enumerate(self.layers):
            q, k, v = layer.qkv(layer.ln1(x)).view(n_tok, 3, cfg.heads, cfg.head_dim).unbind(1)
            kv.k[li].index_copy_(0, new, k)
            kv.v[li].index_copy_(0, new, v)
            out = torch.empty_like(q)
            for s in seqs:
                keys = kv.k[li].index_select(0, s.slots).transpose(0, 1)  # heads, context + n, dim
                values = kv.v[li].index_select(0, s.slots).transpose(0, 1)
                query = q[s.start : s.start + s.n].transpose(0, 1)  # heads, n, dim
                mask = None
                if s.n > 1:  # query i sits at position context + i and sees the keys up to it
                    rows = torch.arange(s.n, device=x.device)[:, None] + s.context
                    mask = torch.arange(s.context + s.n, device=x.device)[None, :] <= rows
                att = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scale)
                out[s.start : s.start + s.n] = att.transpose(0, 1)
            x = x + layer.proj(out.reshape(n_tok, cfg.width))
            x = x + self._mlp(layer, x)
        last = [s.start + s.n - 1 for s in seqs if s.sample]
        if not last:
            return torch.empty(0, VOCAB, dtype=x.dtype, device=x.device)
        return self.ln_f(x[last]) @ self.embed.weight.T

    @torch.no_grad()
    def dense_logits(self, tokens: list[int]) -> torch.Tensor:
        """The next token's logits after ``tokens``, computed over the whole sequence with
        ordinary causal attention and no cache (the reference for the paged path)."""
        cfg = self.cfg
        ids = torch.tensor(tokens, device=self.device)
        n = len(tokens)
        x = self.embed(ids) + self.pos(torch.arange(n, device=self.device))
        for layer in self.layers:
            q, k, v = layer.qkv(layer.ln1(x)).view(n, 3, cfg.heads, cfg.head_dim).unbind(1)
            q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # heads, positions, dim
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(cfg.head_dim))
            x = x + layer.proj(att.transpose(0, 1).reshape(n, cfg.width))
            x = x + self._mlp(layer, x)
        return self.ln_f(x[-1]) @ self.embed.weight.T

    def generate_dense(self, prompt: list[int], max_tokens: int) -> list[int]:
        """Greedy tokens after ``prompt``, one dense pass per token (slow: a reference)."""
        out: list[int] = []
        for _ in range(max_tokens):
            out.append(int(torch.argmax(self.dense_logits(prompt + out))))
        return out
