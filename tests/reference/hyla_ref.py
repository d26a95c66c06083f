#!/usr/bin/env python3
"""hyla_ref.py: an independent PyTorch reference of every hyla model, for conformance.

Written from docs/MODELS.md (the spec) and the papers in shared/papers (SSE: eqs. 7-10 of
sse-sparse-state-expansion.txt), not from the C engine. It computes in float64 by default, so
its own rounding is far below the C engine's fp32 rounding and differences measure the engine.

What it holds:
  * a safetensors reader (json + numpy; F32/F16/BF16/F64, single file or sharded index);
  * the mixers as plain functions on per-head tensors:
      gla_recurrent / gla_chunked           [GLA-1] and its chunked form (C = 64)
      gdn_recurrent / gdn_chunked           [GDN-3] and its WY chunked form (C = 64)
      attention with RoPE, GQA and sliding window [ATTN-1], [ATTN-2]
      SSE with transitions gla and gdn, token by token [SSE-1..4], and the paper's
      varlen prefill (tokens grouped by partition, chunked kernel per partition);
      LTE (learnable token eviction, lte-hybrid-sparse-attention-token-eviction.txt 3.1):
      grouped-Conv1d scores, sink + retained + window attention, token by token [LTE-1..5];
      NSA (flash-linear-attention's nsa layer; mean-pooled compression, block selection,
      window, gates) [NSA-1..4];
      ssd_recurrent / ssd_chunked           Mamba2 [M2-1..3] and its SSD chunked form (C = 64)
      DLA over GDN and over Mamba2 (dla-dynamic-linear-attention.txt, Algorithms 1-2): the
      state cache, token by token, with every choice of docs/MODELS.md 4.7 [DLA-1..5], and the
      margin of every merge/open decision (make_fixtures.py keeps fixtures whose decisions
      fp32 rounding cannot flip);
  * a Session that holds per-layer state, prefills a prompt (recurrent or chunked) and
    decodes greedily, one token at a time, always by the recurrence.

The recurrent forms are the definition; the chunked forms exist so selftest.py can check
they agree (they are what fast engines run).

CLI (mirrors hyla-run's conformance flags):
  hyla_ref.py --model DIR --prompt-ids "1 2 3" --max-tokens 16 [--ids] [--dump-logits F]
              [--dtype float64|float32] [--prefill recurrent|chunked|varlen]
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_np import load_model_dir, read_safetensors  # noqa: E402,F401

CHUNK = 64  # chunk length of the chunked forms; chunks are aligned to absolute positions

# ----------------------------------------------------------------------------------------
# elementwise pieces
# ----------------------------------------------------------------------------------------

def rmsnorm(x, w, eps):
    """[NORM-0] y = x / sqrt(mean(x^2) + eps) * w  (w None: no affine weight)."""
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def gated_rmsnorm(o, w, g, eps):
    """[NORM-1] per head over the value dim: RMSNorm(o; w) * silu(g); g None: no gate."""
    y = rmsnorm(o, w, eps)
    return y if g is None else y * torch.nn.functional.silu(g)


def linear(x, w, b=None):
    y = x @ w.t()
    return y if b is None else y + b


def l2norm(x, eps=1e-6):
    """[GDN-2] x / sqrt(sum(x^2) + 1e-6) over the last dim."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def short_conv(x, w, b, tail):
    """[CONV-1] causal depthwise conv over time, then silu.
    x [T, C]; w [C, 1, K]; tail [K-1, C] (the previous K-1 inputs). Returns (y, new tail)."""
    K = w.shape[-1]
    xx = torch.cat([tail, x], 0)  # [K-1+T, C]
    T = x.shape[0]
    y = torch.zeros_like(x)
    for j in range(K):
        y = y + w[:, 0, j] * xx[j:j + T]
    if b is not None:
        y = y + b
    return torch.nn.functional.silu(y), xx[xx.shape[0] - (K - 1):].clone()


# ----------------------------------------------------------------------------------------
# GLA: S_t = diag(exp(gk_t)) S_{t-1} + k_t^T v_t ;  o_t = (scale q_t) S_t      [GLA-1]
# shapes: q, k, gk [T, H, dk]; v [T, H, dv]; S [H, dk, dv]
# ----------------------------------------------------------------------------------------

def gla_recurrent(q, k, v, gk, S, scale):
    S = S.clone()
    o = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype)
    for t in range(q.shape[0]):
        S = torch.exp(gk[t])[:, :, None] * S + k[t][:, :, None] * v[t][:, None, :]
        o[t] = scale * torch.einsum("hk,hkv->hv", q[t], S)
    return o, S


def _chunk_bounds(T, pos0, C):
    """Chunk [start, end) ranges of a T-token span starting at absolute position pos0, with
    boundaries at multiples of C in absolute position."""
    out, s = [], 0
    while s < T:
        e = min(T, s + C - (pos0 + s) % C)
        out.append((s, e))
        s = e
    return out


def gla_chunked(q, k, v, gk, S, scale, pos0=0, C=CHUNK):
    """The chunked form of MODELS.md 4.1: with b_t = cumulative log decay inside the chunk,
    o_t = scale (q_t*exp(b_t)) S0 + sum_{s<=t} [scale (q_t*exp(b_t-b_s)) . k_s] v_s
    S_C = diag(exp(b_C)) S0 + sum_s (k_s*exp(b_C-b_s))^T v_s."""
    S = S.clone()
    o = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype)
    for s0, s1 in _chunk_bounds(q.shape[0], pos0, C):
        qc, kc, vc = q[s0:s1], k[s0:s1], v[s0:s1]
        b = torch.cumsum(gk[s0:s1], 0)  # [c, H, dk]
        c = s1 - s0
        inter = scale * torch.einsum("thk,hkv->thv", qc * torch.exp(b), S)
        diff = b[:, None] - b[None, :]  # [t, s, H, dk]: b_t - b_s
        causal = torch.tril(torch.ones(c, c, dtype=torch.bool))
        diff = diff.masked_fill(~causal[:, :, None, None], float("-inf"))  # exp(-inf) = 0, no overflow
        A = scale * torch.einsum("thk,shk,tshk->tsh", qc, kc, torch.exp(diff))
        o[s0:s1] = inter + torch.einsum("tsh,shv->thv", A, vc)
        bl = b[-1]  # [H, dk]
        S = torch.exp(bl)[:, :, None] * S + torch.einsum("shk,shv->hkv", kc * torch.exp(bl[None] - b), vc)
    return o, S


# ----------------------------------------------------------------------------------------
# GDN (gated delta rule)                                                          [GDN-3]
#   S' = exp(g_t) S_{t-1};  S_t = S' + beta_t k_t^T (v_t - k_t S');  o_t = (scale q_t) S_t
# shapes: q, k [T, H, dk]; v [T, H, dv]; g, beta [T, H]; S [H, dk, dv]
# ----------------------------------------------------------------------------------------

def gdn_recurrent(q, k, v, g, beta, S, scale):
    S = S.clone()
    o = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype)
    for t in range(q.shape[0]):
        S = torch.exp(g[t])[:, None, None] * S
        pred = torch.einsum("hk,hkv->hv", k[t], S)
        S = S + beta[t][:, None, None] * k[t][:, :, None] * (v[t] - pred)[:, None, :]
        o[t] = scale * torch.einsum("hk,hkv->hv", q[t], S)
    return o, S


def gdn_chunked(q, k, v, g, beta, S, scale, pos0=0, C=CHUNK):
    """WY form. Inside a chunk with cumulative log decay G_t and Gam[t,s] = exp(G_t - G_s):
      S_t = exp(G_t) S0 + sum_{s<=t} Gam[t,s] k_s^T u_s, where the pseudo-values u solve
      (I + tril(diag(beta) K K^T * Gam, -1)) U = diag(beta) (V - diag(exp(G)) K S0)
    (substitute the ansatz into the recurrence: u_t = beta_t (v_t - k_t exp(g_t) S_{t-1})).
      o_t = scale (exp(G_t) q_t S0 + sum_{s<=t} Gam[t,s] (q_t . k_s) u_s)."""
    S = S.clone()
    o = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype)
    for s0, s1 in _chunk_bounds(q.shape[0], pos0, C):
        c = s1 - s0
        qc, kc, vc, bc = q[s0:s1], k[s0:s1], v[s0:s1], beta[s0:s1]
        G = torch.cumsum(g[s0:s1], 0)  # [c, H]
        diff = G[:, None, :] - G[None, :, :]  # [t, s, H]
        incl = torch.tril(torch.ones(c, c, dtype=torch.bool))
        strict = torch.tril(torch.ones(c, c, dtype=torch.bool), -1)
        gam_incl = torch.exp(diff.masked_fill(~incl[:, :, None], float("-inf")))
        gam_strict = torch.exp(diff.masked_fill(~strict[:, :, None], float("-inf")))
        KK = torch.einsum("thk,shk->tsh", kc, kc)
        A = bc[:, None, :] * KK * gam_strict  # [t, s, H]
        M = torch.eye(c, dtype=q.dtype)[:, :, None] + A
        rhs = bc[:, :, None] * (vc - torch.exp(G)[:, :, None] * torch.einsum("thk,hkv->thv", kc, S))
        # per head: solve the unit lower-triangular system M U = rhs
        U = torch.linalg.solve_triangular(M.permute(2, 0, 1), rhs.permute(1, 0, 2), upper=False)  # [H, c, dv]
        U = U.permute(1, 0, 2)  # [c, H, dv]
        QK = torch.einsum("thk,shk->tsh", qc, kc) * gam_incl
        o[s0:s1] = scale * (torch.exp(G)[:, :, None] * torch.einsum("thk,hkv->thv", qc, S)
                            + torch.einsum("tsh,shv->thv", QK, U))
        Gl = G[-1]  # [H]
        S = torch.exp(Gl)[:, None, None] * S + torch.einsum("sh,shk,shv->hkv", torch.exp(Gl[None] - G), kc, U)
    return o, S


# ----------------------------------------------------------------------------------------
# softmax attention                                                      [ATTN-1], [ATTN-2]
# ----------------------------------------------------------------------------------------

def rope(x, pos, theta):
    """Rotate-half RoPE. x [T, H, hd]; pos [T] absolute positions."""
    hd = x.shape[-1]
    half = hd // 2
    j = torch.arange(half, dtype=x.dtype)
    inv = theta ** (-2.0 * j / hd)
    ang = pos.to(x.dtype)[:, None] * inv[None, :]  # [T, half]
    cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def attention(q, kc, vc, pos0, window):
    """q [T, Hq, hd] at positions pos0..pos0+T-1; kc, vc [P, Hk, hd] hold positions 0..P-1
    (P = pos0 + T). Query at p sees keys [max(0, p-W+1), p]."""
    T, Hq, hd = q.shape
    P, Hk, _ = kc.shape
    rep = Hq // Hk
    kk = kc.repeat_interleave(rep, dim=1)  # query head h uses kv head h // rep
    vv = vc.repeat_interleave(rep, dim=1)
    sc = torch.einsum("thd,phd->htp", q, kk) * hd ** -0.5
    qp = torch.arange(pos0, pos0 + T)[:, None]
    kp = torch.arange(P)[None, :]
    ok = kp <= qp
    if window is not None:
        ok = ok & (kp >= qp - window + 1)
    sc = sc.masked_fill(~ok[None], float("-inf"))
    p = torch.softmax(sc, -1)
    return torch.einsum("htp,phd->thd", p, vv)


# ----------------------------------------------------------------------------------------
# SSE routing                                                                       [SSE-1]
# ----------------------------------------------------------------------------------------

def route(logits_e, K):
    """e = softmax(x We^T) per token; T = the K largest entries, descending, lower index first
    on ties. Returns (e [T, N], sel: list of lists of partition indices, margin: list of the
    gap between the K-th and (K+1)-th largest probability per token (inf when K == N))."""
    e = torch.softmax(logits_e, -1)
    sel, margin = [], []
    en = e.detach().cpu().numpy().astype(np.float64)
    for row in en:
        order = sorted(range(len(row)), key=lambda i: (-row[i], i))
        sel.append(order[:K])
        margin.append(row[order[K - 1]] - row[order[K]] if K < len(row) else float("inf"))
    return e, sel, margin


# ----------------------------------------------------------------------------------------
# Mamba2 (SSD) [M2-1..3]: per head, S [N, P]; a_t = -exp(A_log) dt'_t
#   S_t = exp(a_t) S_{t-1} + B_t^T (dt'_t x_t) ;  y_t = C_t S_t + D x_t
# shapes: x [T, H, P]; Bm, Cm [T, H, N] (already expanded from groups to heads); a, dtp [T, H]
# ----------------------------------------------------------------------------------------

def ssd_recurrent(x, Bm, Cm, dtp, a, Dsk, S):
    T = x.shape[0]
    ys = []
    for t in range(T):
        S = torch.exp(a[t])[:, None, None] * S + Bm[t][:, :, None] * (dtp[t][:, None] * x[t])[:, None, :]
        ys.append(torch.einsum("hn,hnp->hp", Cm[t], S) + Dsk[:, None] * x[t])
    return torch.stack(ys, 0), S


def ssd_chunked(x, Bm, Cm, dtp, a, Dsk, S, pos0=0, C=CHUNK):
    """The SSD chunked form over chunks aligned to absolute positions (MODELS.md 4.6)."""
    T = x.shape[0]
    ys = []
    for s0, s1 in _chunk_bounds(T, pos0, C):
        b = torch.cumsum(a[s0:s1], 0)                      # [L, H]
        v = dtp[s0:s1][:, :, None] * x[s0:s1]              # [L, H, P]
        Cc, Bc = Cm[s0:s1], Bm[s0:s1]
        L = s1 - s0
        y0 = torch.exp(b)[:, :, None] * torch.einsum("thn,hnp->thp", Cc, S)
        diff = b[:, None, :] - b[None, :, :]               # [t, s, H]
        mask = torch.tril(torch.ones(L, L, dtype=torch.bool))[:, :, None]
        dec = torch.where(mask, torch.exp(torch.where(mask, diff, torch.zeros_like(diff))), torch.zeros_like(diff))
        Amat = torch.einsum("thn,shn->tsh", Cc, Bc) * dec
        y = y0 + torch.einsum("tsh,shp->thp", Amat, v) + Dsk[None, :, None] * x[s0:s1]
        ys.append(y)
        bl = b[-1]
        S = torch.exp(bl)[:, None, None] * S + torch.einsum("sh,shn,shp->hnp", torch.exp(bl[None, :] - b), Bc, v)
    return torch.cat(ys, 0), S


# ----------------------------------------------------------------------------------------
# layers
# ----------------------------------------------------------------------------------------

class Weights:
    def __init__(self, raw, dtype):
        self.raw, self.dtype = raw, dtype
        self.used = set()

    def has(self, name):
        return name in self.raw

    def __call__(self, name, shape=None):
        if name not in self.raw:
            raise KeyError("missing tensor %r" % name)
        a = self.raw[name]
        if shape is not None and tuple(a.shape) != tuple(shape):
            raise ValueError("tensor %r has shape %s, expected %s" % (name, list(a.shape), list(shape)))
        self.used.add(name)
        return torch.from_numpy(np.asarray(a, dtype=np.float64)).to(self.dtype)

    def opt(self, name, shape=None):
        return self(name, shape) if name in self.raw else None


def _gate_lowrank(x, w0, w1, b1):
    """FLA's gk_proj: Linear(D, r, bias=False) then Linear(r, H*dk, bias=True)."""
    return linear(linear(x, w0), w1, b1)


class GLALayer:
    kind = "gla"

    def __init__(self, cfg, W, p, D):
        H = cfg["num_heads"]
        self.H = H
        ek, ev = cfg.get("expand_k", 0.5), cfg.get("expand_v", 1.0)
        self.dk, self.dv = int(D * ek) // H, int(D * ev) // H
        dk, dv, r = self.dk, self.dv, cfg.get("gate_low_rank_dim", 16)
        self.eps = cfg.get("norm_eps", 1e-6)
        self.norm_div = cfg.get("gate_logit_normalizer", 16)
        self.clamp_min = cfg.get("clamp_min", None)
        self.wq, self.wk = W(p + "q_proj.weight", (H * dk, D)), W(p + "k_proj.weight", (H * dk, D))
        self.wv = W(p + "v_proj.weight", (H * dv, D))
        self.g0, self.g1 = W(p + "gk_proj.0.weight", (r, D)), W(p + "gk_proj.1.weight", (H * dk, r))
        self.g1b = W(p + "gk_proj.1.bias", (H * dk,))
        self.use_gate = cfg.get("use_output_gate", True)
        affine = cfg.get("elementwise_affine", True)
        if self.use_gate:
            self.wg = W(p + "g_proj.weight", (H * dv, D))
            self.onorm = W(p + "g_norm_swish_gate.weight", (dv,)) if affine else None
        else:
            self.onorm = W(p + "g_norm.weight", (dv,)) if affine else None
        self.wo = W(p + "o_proj.weight", (D, H * dv))
        self.conv = cfg.get("use_short_conv", False)
        self.K = cfg.get("conv_size", 4)
        if self.conv:
            self.cw = [W(p + n + "_conv1d.weight", (c, 1, self.K)) for n, c in (("q", H * dk), ("k", H * dk), ("v", H * dv))]
            self.cb = [W.opt(p + n + "_conv1d.bias", (c,)) for n, c in (("q", H * dk), ("k", H * dk), ("v", H * dv))]

    def init_state(self, dt):
        st = {"S": torch.zeros(self.H, self.dk, self.dv, dtype=dt)}
        if self.conv:
            st["conv"] = [torch.zeros(self.K - 1, w.shape[0], dtype=dt) for w in self.cw]
        return st

    def __call__(self, x, st, pos0, mode):
        T, H, dk, dv = x.shape[0], self.H, self.dk, self.dv
        q, k, v = linear(x, self.wq), linear(x, self.wk), linear(x, self.wv)
        if self.conv:
            outs = []
            for i, a in enumerate((q, k, v)):
                y, st["conv"][i] = short_conv(a, self.cw[i], self.cb[i], st["conv"][i])
                outs.append(y)
            q, k, v = outs
        gk = torch.nn.functional.logsigmoid(_gate_lowrank(x, self.g0, self.g1, self.g1b)) / self.norm_div
        if self.clamp_min is not None:
            gk = torch.clamp(gk, min=self.clamp_min)
        q, k, gk, v = q.view(T, H, dk), k.view(T, H, dk), gk.view(T, H, dk), v.view(T, H, dv)
        fn = gla_recurrent if mode == "recurrent" else (lambda *a: gla_chunked(*a, pos0=pos0))
        o, st["S"] = fn(q, k, v, gk, st["S"], dk ** -0.5)
        g = linear(x, self.wg).view(T, H, dv) if self.use_gate else None
        o = gated_rmsnorm(o, self.onorm, g, self.eps)
        return linear(o.reshape(T, H * dv), self.wo)


class GDNLayer:
    kind = "gdn"

    def __init__(self, cfg, W, p, D):
        H = cfg["num_heads"]
        self.H = H
        self.dk = cfg.get("head_dim", 256)
        self.dv = int(self.dk * cfg.get("expand_v", 2))
        dk, dv = self.dk, self.dv
        self.eps = cfg.get("norm_eps", 1e-6)
        self.wq, self.wk = W(p + "q_proj.weight", (H * dk, D)), W(p + "k_proj.weight", (H * dk, D))
        self.wv = W(p + "v_proj.weight", (H * dv, D))
        self.wa, self.wb = W(p + "a_proj.weight", (H, D)), W(p + "b_proj.weight", (H, D))
        self.A_log, self.dt_bias = W(p + "A_log", (H,)), W(p + "dt_bias", (H,))
        self.neg = cfg.get("allow_neg_eigval", False)
        self.use_gate = cfg.get("use_gate", True)
        self.wg = W(p + "g_proj.weight", (H * dv, D)) if self.use_gate else None
        self.onorm = W(p + "o_norm.weight", (dv,))
        self.wo = W(p + "o_proj.weight", (D, H * dv))
        self.conv = cfg.get("use_short_conv", True)
        self.K = cfg.get("conv_size", 4)
        if self.conv:
            self.cw = [W(p + n + "_conv1d.weight", (c, 1, self.K)) for n, c in (("q", H * dk), ("k", H * dk), ("v", H * dv))]
            self.cb = [W.opt(p + n + "_conv1d.bias", (c,)) for n, c in (("q", H * dk), ("k", H * dk), ("v", H * dv))]

    def init_state(self, dt):
        st = {"S": torch.zeros(self.H, self.dk, self.dv, dtype=dt)}
        if self.conv:
            st["conv"] = [torch.zeros(self.K - 1, w.shape[0], dtype=dt) for w in self.cw]
        return st

    def _project(self, x, st):
        """q, k [T][H][dk] (l2-normalised), v [T][H][dv], g, beta [T][H] ([GDN-1..2])."""
        T, H, dk, dv = x.shape[0], self.H, self.dk, self.dv
        q, k, v = linear(x, self.wq), linear(x, self.wk), linear(x, self.wv)
        if self.conv:
            outs = []
            for i, a in enumerate((q, k, v)):
                y, st["conv"][i] = short_conv(a, self.cw[i], self.cb[i], st["conv"][i])
                outs.append(y)
            q, k, v = outs
        else:
            q, k, v = [torch.nn.functional.silu(a) for a in (q, k, v)]
        g = -torch.exp(self.A_log) * torch.nn.functional.softplus(linear(x, self.wa) + self.dt_bias)  # [GDN-1]
        beta = torch.sigmoid(linear(x, self.wb))
        if self.neg:
            beta = beta * 2
        q, k = l2norm(q.view(T, H, dk)), l2norm(k.view(T, H, dk))
        return q, k, v.view(T, H, dv), g, beta

    def _finish(self, x, o):
        T, H, dv = x.shape[0], self.H, self.dv
        gate = linear(x, self.wg).view(T, H, dv) if self.use_gate else None
        o = gated_rmsnorm(o, self.onorm, gate, self.eps)
        return linear(o.reshape(T, H * dv), self.wo)

    def __call__(self, x, st, pos0, mode):
        q, k, v, g, beta = self._project(x, st)
        fn = gdn_recurrent if mode == "recurrent" else (lambda *a: gdn_chunked(*a, pos0=pos0))
        o, st["S"] = fn(q, k, v, g, beta, st["S"], self.dk ** -0.5)
        return self._finish(x, o)


def dla_score(s, S, tau):
    """[DLA-2] ||rms(s) - rms(S)||_F / (||rms(S)||_F + 1e-6); tau for an empty cache or S = 0."""
    if S is None or float((S * S).sum()) == 0.0:
        return tau
    rs = s / torch.sqrt((s * s).mean() + 1e-6)
    rS = S / torch.sqrt((S * S).mean() + 1e-6)
    return float(torch.linalg.norm(rs - rS) / (torch.linalg.norm(rS) + 1e-6))


def dla_recurrent(q, k, v, g, erase, write, lam, cache, scale, K, tau, margins):
    """[DLA-1..5] token by token. cache: per head {"S": [dk x dv, oldest first], "n": [], "I": []},
    updated in place; lam [T][H][K] logits. Returns o [T][H][dv]. margins gets the distance of
    every decision from flipping (|I - tau|; the gap between the two lowest pair densities)."""
    T, H = q.shape[0], q.shape[1]
    o = torch.empty(T, H, v.shape[2], dtype=q.dtype)
    for t in range(T):
        for h in range(H):
            c = cache[h]
            kt, vt = k[t, h], v[t, h]
            s = write[t, h] * torch.outer(kt, vt)
            It = dla_score(s, c["S"][-1] if c["S"] else None, tau)
            if c["S"] and It != tau:
                margins.append(abs(It - tau))
            a, e = torch.exp(g[t, h]), erase[t, h]
            c["S"] = [a * (S - e * torch.outer(kt, kt @ S)) for S in c["S"]]
            if not c["S"] or It >= tau:
                if len(c["S"]) == K:
                    dens = [(c["I"][i] + c["I"][i + 1]) / (c["n"][i] + c["n"][i + 1]) for i in range(K - 1)]
                    b = min(range(K - 1), key=lambda i: (dens[i], i))
                    if len(dens) > 1:  # the pick among two or more pairs could flip
                        margins.append(sorted(dens)[1] - sorted(dens)[0])
                    c["S"][b] = c["S"][b] + c["S"].pop(b + 1)
                    c["n"][b] += c["n"].pop(b + 1)
                    c["I"][b] += c["I"].pop(b + 1)
                c["S"].append(torch.zeros_like(s))
                c["n"].append(0)
                c["I"].append(0.0)
            c["S"][-1] = c["S"][-1] + s
            c["n"][-1] += 1
            c["I"][-1] += It
            m = len(c["S"])
            lv = torch.nn.functional.softplus(lam[t, h])
            o[t, h] = scale * sum(lv[m - 1 - i] * (q[t, h] @ c["S"][i]) for i in range(m))
    return o


class DLAGDNLayer(GDNLayer):
    """Dynamic linear attention over gated DeltaNet (docs/MODELS.md 4.7): the GDN projections and
    output stage, the state cache of dla-dynamic-linear-attention.txt in place of one state."""
    kind = "dla-gdn"

    def __init__(self, cfg, W, p, D):
        super().__init__(cfg, W, p, D)
        self.cap = cfg.get("dla_capacity", 30)
        self.tau = cfg.get("dla_threshold", 0.6)
        self.wl = W(p + "l_proj.weight", (self.H * self.cap, D))
        self.bl = W(p + "l_proj.bias", (self.H * self.cap,))
        self.margins = []  # decision margins (for the fixture generator's choice of robust seeds)

    def init_state(self, dt):
        st = super().init_state(dt)
        del st["S"]
        st["cache"] = [{"S": [], "n": [], "I": []} for _ in range(self.H)]
        return st

    def __call__(self, x, st, pos0, mode):
        q, k, v, g, beta = self._project(x, st)
        lam = linear(x, self.wl, self.bl).view(x.shape[0], self.H, self.cap)
        o = dla_recurrent(q, k, v, g, beta, beta, lam, st["cache"], self.dk ** -0.5, self.cap, self.tau,
                          self.margins)
        return self._finish(x, o)


class SSELayer:
    """Sparse state expansion, MODELS.md 4.3 (paper eqs. 7-10)."""
    kind = "sse"

    def __init__(self, cfg, W, p, D):
        H = cfg["num_heads"]
        self.H = H
        self.dk = cfg.get("head_dim", 64)
        self.dv = int(self.dk * cfg.get("expand_v", 1.0))
        dk, dv = self.dk, self.dv
        self.N = cfg.get("num_sparse_partition", 4)
        self.K = cfg.get("num_writer", 1)
        if cfg.get("num_reader", self.K) != self.K:
            raise ValueError("num_reader must equal num_writer")
        if cfg.get("use_short_conv", False):
            raise ValueError("SSE: use_short_conv must be false")
        self.trans = cfg.get("sse_transition", "gla")
        if self.trans not in ("gla", "gdn"):
            raise ValueError("unknown sse_transition %r" % self.trans)
        self.eps = cfg.get("norm_eps", 1e-6)
        self.norm_div = cfg.get("gate_logit_normalizer", 16)
        self.clamp_min = cfg.get("clamp_min", None)
        self.q_softmax = cfg.get("use_q_softmax", False)
        self.k_softmax = cfg.get("use_k_softmax", True)
        lr = cfg.get("lora_rank", None) or dv
        self.lora_target = cfg.get("lora_target", "always")
        if self.lora_target not in ("always", "sparse"):
            raise ValueError("unknown lora_target %r" % self.lora_target)
        self.neg = cfg.get("allow_neg_eigval", False)
        N, r = self.N, cfg.get("gate_low_rank_dim", 16)
        self.wq, self.wk = W(p + "q_proj.weight", (H * dk, D)), W(p + "k_proj.weight", (H * dk, D))
        self.wv = W(p + "v_proj.weight", (H * dv, D))
        self.lq = (W(p + "lora_q_proj.0.weight", (lr, D)), W(p + "lora_q_proj.1.weight", (H * dk, lr)))
        self.lk = (W(p + "lora_k_proj.0.weight", (lr, D)), W(p + "lora_k_proj.1.weight", (H * dk, lr)))
        self.we = W(p + "e_proj.weight", (N, D))
        if self.trans == "gla":
            self.gk = [(W(p + "gk_proj.%d.0.weight" % j, (r, D)), W(p + "gk_proj.%d.1.weight" % j, (H * dk, r)),
                        W(p + "gk_proj.%d.1.bias" % j, (H * dk,))) for j in (0, 1)]
        else:
            self.wa, self.wb = W(p + "a_proj.weight", (2 * H, D)), W(p + "b_proj.weight", (2 * H, D))
            self.A_log, self.dt_bias = W(p + "A_log", (2 * H,)), W(p + "dt_bias", (2 * H,))
        self.use_gate = cfg.get("use_output_gate", True)
        if self.use_gate:
            self.wg0, self.wg1 = W(p + "g_proj.0.weight", (dv, D)), W(p + "g_proj.1.weight", (H * dv, dv))
        self.onorm = W(p + "o_norm.weight", (dv,))
        self.wo = W(p + "o_proj.weight", (D, H * dv))
        self.margins = []  # routing margins seen (for fixture robustness reports)

    def init_state(self, dt):
        return {"S0": torch.zeros(self.H, self.dk, self.dv, dtype=dt),
                "Sp": torch.zeros(self.N, self.H, self.dk, self.dv, dtype=dt)}

    def _fmap(self, a, use_softmax):
        return torch.softmax(a, -1) if use_softmax else torch.nn.functional.silu(a)

    def features(self, x):
        """Per-token quantities of MODELS.md 4.3, before the recurrence."""
        T, H, dk, dv = x.shape[0], self.H, self.dk, self.dv
        qa = linear(x, self.wq)
        ka = linear(x, self.wk)
        qs, ks = qa.clone(), ka.clone()
        lq = linear(linear(x, self.lq[0]), self.lq[1])
        lk = linear(linear(x, self.lk[0]), self.lk[1])
        if self.lora_target == "always":
            qa, ka = qa + lq, ka + lk
        else:
            qs, ks = qs + lq, ks + lk
        qa, qs = [self._fmap(a.view(T, H, dk), self.q_softmax) for a in (qa, qs)]
        ka, ks = [self._fmap(a.view(T, H, dk), self.k_softmax) for a in (ka, ks)]
        v = torch.nn.functional.silu(linear(x, self.wv)).view(T, H, dv)
        f = {"qa": qa, "ka": ka, "qs": qs, "ks": ks, "v": v}
        if self.trans == "gla":
            for j, nm in ((0, "gk0"), (1, "gk1")):
                gk = torch.nn.functional.logsigmoid(_gate_lowrank(x, *self.gk[j])) / self.norm_div
                if self.clamp_min is not None:
                    gk = torch.clamp(gk, min=self.clamp_min)
                f[nm] = gk.view(T, H, dk)
        else:
            f["qa"], f["ka"], f["qs"], f["ks"] = [l2norm(f[n]) for n in ("qa", "ka", "qs", "ks")]  # Choice (b)
            g = -torch.exp(self.A_log) * torch.nn.functional.softplus(linear(x, self.wa) + self.dt_bias)  # [T, 2H]
            beta = torch.sigmoid(linear(x, self.wb))
            if self.neg:
                beta = beta * 2
            f["g0"], f["g1"] = g[:, :H], g[:, H:]
            f["b0"], f["b1"] = beta[:, :H], beta[:, H:]
        e, sel, margin = route(linear(x, self.we), self.K)
        f["e"], f["sel"], f["margin"] = e, sel, margin
        return f

    def _run(self, chunked, q, k, v, t0, t1, S, scale, pos0):
        """One partition's transition on tokens (q,k,v already w-scaled) with decay args t0, t1."""
        if self.trans == "gla":
            return gla_chunked(q, k, v, t0, S, scale, pos0=pos0) if chunked else gla_recurrent(q, k, v, t0, S, scale)
        return gdn_chunked(q, k, v, t0, t1, S, scale, pos0=pos0) if chunked else gdn_recurrent(q, k, v, t0, t1, S, scale)

    def __call__(self, x, st, pos0, mode):
        T, H, dk, dv = x.shape[0], self.H, self.dk, self.dv
        f = self.features(x)
        self.margins.extend(f["margin"])
        scale = dk ** -0.5
        gla = self.trans == "gla"
        d0a, d0b = (f["gk0"], None) if gla else (f["g0"], f["b0"])
        d1a, d1b = (f["gk1"], None) if gla else (f["g1"], f["b1"])
        if mode == "recurrent":
            # token by token, exactly [SSE-3] and [SSE-4]
            o = torch.empty(T, H, dv, dtype=x.dtype)
            S0, Sp = st["S0"], st["Sp"].clone()
            for t in range(T):
                sl = slice(t, t + 1)
                oa, S0 = self._run(False, f["qa"][sl], f["ka"][sl], f["v"][sl], d0a[sl],
                                   None if gla else d0b[sl], S0, scale, pos0 + t)
                acc = oa[0]
                for i in f["sel"][t]:
                    w = f["e"][t, i]
                    oi, Sp[i] = self._run(False, w * f["qs"][sl], w * f["ks"][sl], f["v"][sl], d1a[sl],
                                          None if gla else d1b[sl], Sp[i], scale, pos0 + t)
                    acc = acc + oi[0]
                o[t] = acc
            st["S0"], st["Sp"] = S0, Sp
        else:
            # the paper's varlen prefill (Algorithm 2): the always-selected partition over all
            # tokens, each sparse partition over the tokens that selected it, chunked kernels
            chunked = mode == "chunked"
            o, st["S0"] = self._run(chunked, f["qa"], f["ka"], f["v"], d0a, d0b, st["S0"], scale, pos0)
            Sp = st["Sp"].clone()
            for i in range(self.N):
                idx = [t for t in range(T) if i in f["sel"][t]]
                if not idx:
                    continue
                ix = torch.tensor(idx)
                w = f["e"][ix, i][:, None, None]
                oi, Sp[i] = self._run(chunked, w * f["qs"][ix], w * f["ks"][ix], f["v"][ix], d1a[ix],
                                      None if gla else d1b[ix], Sp[i], scale, 0)
                o = o.index_add(0, ix, oi)
            st["Sp"] = Sp
        g = linear(linear(x, self.wg0), self.wg1).view(T, H, dv) if self.use_gate else None
        o = gated_rmsnorm(o, self.onorm, g, self.eps)
        return linear(o.reshape(T, H * dv), self.wo)


class AttnLayer:
    kind = "attn"

    def __init__(self, spec, W, p, D, qk_norm_allowed):
        self.Hq = spec["num_heads"]
        self.Hk = spec.get("num_kv_heads", None) or self.Hq
        self.hd = D // self.Hq
        self.window = spec.get("window_size", None)
        self.theta = spec.get("rope_theta", 10000.0) or 10000.0
        bias = spec.get("qkv_bias", False)
        Hq, Hk, hd = self.Hq, self.Hk, self.hd
        self.wq, self.wk, self.wv = W(p + "q_proj.weight", (Hq * hd, D)), W(p + "k_proj.weight", (Hk * hd, D)), W(p + "v_proj.weight", (Hk * hd, D))
        self.bq = W(p + "q_proj.bias", (Hq * hd,)) if bias else None
        self.bk = W(p + "k_proj.bias", (Hk * hd,)) if bias else None
        self.bv = W(p + "v_proj.bias", (Hk * hd,)) if bias else None
        self.wo = W(p + "o_proj.weight", (D, Hq * hd))
        self.qk_norm = qk_norm_allowed and spec.get("qk_norm", False)
        if self.qk_norm:
            self.qn, self.kn = W(p + "q_norm.weight", (hd,)), W(p + "k_norm.weight", (hd,))

    def init_state(self, dt):
        return {"k": torch.zeros(0, self.Hk, self.hd, dtype=dt), "v": torch.zeros(0, self.Hk, self.hd, dtype=dt)}

    def __call__(self, x, st, pos0, mode):
        T = x.shape[0]
        q = linear(x, self.wq, self.bq).view(T, self.Hq, self.hd)
        k = linear(x, self.wk, self.bk).view(T, self.Hk, self.hd)
        v = linear(x, self.wv, self.bv).view(T, self.Hk, self.hd)
        if self.qk_norm:  # per head, before RoPE, eps 1e-5 (MODELS.md 2)
            q, k = rmsnorm(q, self.qn, 1e-5), rmsnorm(k, self.kn, 1e-5)
        pos = torch.arange(pos0, pos0 + T)
        q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)
        st["k"], st["v"] = torch.cat([st["k"], k], 0), torch.cat([st["v"], v], 0)
        o = attention(q, st["k"], st["v"], pos0, self.window)
        return linear(o.reshape(T, self.Hq * self.hd), self.wo)


class LTELayer:
    """Learnable token eviction (docs/MODELS.md 5.1, [LTE-1..5]; lte-hybrid-sparse-attention-
    token-eviction.txt 3.1): attention over sink + retained + window, token by token. Scores come
    from the true pre-RoPE keys through a stack of grouped Conv1d (torch's, padding c*dil on both
    sides: the left padding is the spec's, the right side is never read because a score is used
    only once its field is complete). margins: the distance of every retention decision from
    flipping (|r - 0.5|, |r - r_victim|, the gap between the two lowest scores of a full
    segment), for the fixture generator's choice of robust seeds."""
    kind = "lte"

    def __init__(self, spec, W, p, D):
        self.Hq = spec["num_heads"]
        self.Hk = spec.get("num_kv_heads", None) or self.Hq
        self.hd = spec.get("head_dim", None) or D // self.Hq
        self.theta = spec.get("rope_theta", 10000.0) or 10000.0
        self.s, self.w, self.b = spec.get("sink_size", 4), spec.get("window_size", 768), spec.get("budget", 512)
        self.K, self.dil = spec.get("conv_kernel_size", 3), spec.get("conv_dilation", 2)
        ch = spec.get("conv_channels", None) or [self.hd, self.hd // 2, self.hd // 4]
        self.ch = [2 * self.hd] + list(ch)
        self.h = len(ch) * (self.K - 1) // 2 * self.dil
        Hq, Hk, hd = self.Hq, self.Hk, self.hd
        self.wq, self.wk, self.wv = W(p + "q_proj.weight", (Hq * hd, D)), W(p + "k_proj.weight", (Hk * hd, D)), W(p + "v_proj.weight", (Hk * hd, D))
        self.wo = W(p + "o_proj.weight", (D, Hq * hd))
        self.cw, self.cb = [], []
        for l in range(len(ch)):
            self.cw.append(W(p + "lte.convs.%d.weight" % l, (Hk * self.ch[l + 1], self.ch[l], self.K)))
            self.cb.append(W(p + "lte.convs.%d.bias" % l, (Hk * self.ch[l + 1],)))
        self.pw = W(p + "lte.proj.weight", (Hk, self.ch[-1], 1))
        self.pb = W(p + "lte.proj.bias", (Hk,))
        self.margins = []

    def init_state(self, dt):
        z = torch.zeros(0, self.Hk, self.hd, dtype=dt)
        return {"kpre": z, "k": z, "v": z, "ret": [[] for _ in range(self.Hk)]}

    def scores(self, kpre, v):
        """r [N, Hk] of every position of the history (valid where the field is complete)."""
        N = kpre.shape[0]
        x = torch.cat([kpre, v], -1).reshape(N, self.Hk * 2 * self.hd).T[None]  # [1, Hk*2hd, N]
        pad = (self.K - 1) // 2 * self.dil
        for w, b in zip(self.cw, self.cb):
            x = torch.nn.functional.silu(torch.nn.functional.conv1d(x, w, b, padding=pad, dilation=self.dil, groups=self.Hk))
        x = torch.nn.functional.conv1d(x, self.pw, self.pb, groups=self.Hk)
        return torch.sigmoid(x[0].T)

    def step(self, st, t, q):
        """Token t is in the history: evict t - w, then attend q [Hq, hd]."""
        e = t - self.w
        if e >= self.s:
            r = self.scores(st["kpre"][: e + self.h + 1], st["v"][: e + self.h + 1])[e]
            for h in range(self.Hk):
                re, seg = float(r[h]), st["ret"][h]
                self.margins.append(abs(re - 0.5))
                if not re > 0.5:
                    continue
                if len(seg) < self.b:
                    seg.append((e, re))
                    continue
                order = sorted(range(len(seg)), key=lambda i: (seg[i][1], seg[i][0]))  # lowest, oldest first
                vi = order[0]
                if len(order) > 1:
                    self.margins.append(seg[order[1]][1] - seg[vi][1])
                self.margins.append(abs(re - seg[vi][1]))
                if re > seg[vi][1]:
                    seg[vi] = (e, re)
        rep = self.Hq // self.Hk
        o = torch.empty(self.Hq, self.hd, dtype=q.dtype)
        for h in range(self.Hk):
            vis = list(range(min(self.s, t + 1))) + [pp for pp, _ in st["ret"][h]] + list(range(max(self.s, t - self.w + 1), t + 1))
            kk, vv = st["k"][vis, h], st["v"][vis, h]
            for g in range(rep):
                qh = q[h * rep + g]
                p = torch.softmax(kk @ qh * self.hd ** -0.5, -1)
                o[h * rep + g] = p @ vv
        return o

    def __call__(self, x, st, pos0, mode):
        T = x.shape[0]
        q = linear(x, self.wq).view(T, self.Hq, self.hd)
        k = linear(x, self.wk).view(T, self.Hk, self.hd)
        v = linear(x, self.wv).view(T, self.Hk, self.hd)
        pos = torch.arange(pos0, pos0 + T)
        q, kr = rope(q, pos, self.theta), rope(k, pos, self.theta)
        out = []
        for i in range(T):
            st["kpre"] = torch.cat([st["kpre"], k[i : i + 1]], 0)
            st["k"] = torch.cat([st["k"], kr[i : i + 1]], 0)
            st["v"] = torch.cat([st["v"], v[i : i + 1]], 0)
            out.append(self.step(st, pos0 + i, q[i]))
        o = torch.stack(out, 0)
        return linear(o.reshape(T, self.Hq * self.hd), self.wo)


def nsa_attend(q, k, v, g, block, counts, window, scale):
    """Native sparse attention of the queries of the last T positions of k, v (docs/MODELS.md 5.2,
    [NSA-1..4]). q [T, Hq, hd] at positions P-T..P-1; k, v [P, Hk, hd] (rotated keys);
    g [T, Hq, 3] gate logits (cmp, slc, swa). Token by token, per KV head and query group."""
    T, Hq, hd = q.shape
    P, Hk, _ = k.shape
    G = Hq // Hk
    o = torch.zeros(T, Hq, hd, dtype=q.dtype)
    nblk = P // block
    kc = k[: nblk * block].reshape(nblk, block, Hk, hd).mean(1)  # mean pooling of whole blocks
    vc = v[: nblk * block].reshape(nblk, block, Hk, hd).mean(1)
    gs = torch.sigmoid(g)
    margins = []
    for i in range(T):
        p = P - T + i
        nc, cur = (p + 1) // block, p // block
        for h in range(Hk):
            qg = q[i, h * G:(h + 1) * G]  # [G, hd]
            if nc > 0:
                pr = torch.softmax(qg @ kc[:nc, h].T * scale, -1)  # [G, nc]
                ocmp = pr @ vc[:nc, h]
                score = torch.zeros(cur + 1, dtype=q.dtype)
                score[:nc] = pr.mean(0)
            else:
                ocmp = torch.zeros(G, hd, dtype=q.dtype)
                score = torch.zeros(cur + 1, dtype=q.dtype)
            for c in {0, cur, cur - 1}:
                if 0 <= c <= cur:
                    score[c] = 1.0
            order = sorted(range(cur + 1), key=lambda c: (-float(score[c]), c))  # ties: lower block
            sel = order[:counts]
            if len(order) > counts:
                margins.append(float(score[order[counts - 1]] - score[order[counts]]))
            pos = [t for c in sel for t in range(c * block, min((c + 1) * block, p + 1))]
            kk, vv = k[pos, h], v[pos, h]
            oslc = torch.softmax(qg @ kk.T * scale, -1) @ vv
            out = oslc * gs[i, h * G:(h + 1) * G, 1:2] + ocmp * gs[i, h * G:(h + 1) * G, 0:1]
            if window and window > 0:
                lo = max(0, p - window + 1)
                oswa = torch.softmax(qg @ k[lo:p + 1, h].T * scale, -1) @ v[lo:p + 1, h]
                out = out + oswa * gs[i, h * G:(h + 1) * G, 2:3]
            o[i, h * G:(h + 1) * G] = out
    return o, margins


class NSALayer:
    """flash-linear-attention's NativeSparseAttention (q/k/v/g/o projections, RoPE, GQA), with the
    math of its naive reference: mean-pooled compression, top-n block selection with the first,
    current and previous blocks forced, a sliding window, sigmoid gates. margins: the score gap
    at every selection boundary (the fixture generator's robustness check)."""
    kind = "nsa"

    def __init__(self, cfg, W, p, D, spec):
        self.Hq = cfg.get("num_heads", None) or (None if spec else 64)
        self.Hk = cfg.get("num_kv_heads", None) or (self.Hq if spec else 4)
        self.hd = cfg.get("head_dim", None) or (64 if spec else 32)
        self.theta = cfg.get("rope_theta", 10000.0) or 10000.0
        self.block = cfg.get("block_size", 64)
        self.counts = cfg.get("block_counts", 16)
        self.window = cfg.get("window_size", 512) or 0
        bias = cfg.get("qkv_bias", False)
        Hq, Hk, hd = self.Hq, self.Hk, self.hd
        self.wq, self.wk, self.wv = W(p + "q_proj.weight", (Hq * hd, D)), W(p + "k_proj.weight", (Hk * hd, D)), W(p + "v_proj.weight", (Hk * hd, D))
        self.bq = W(p + "q_proj.bias", (Hq * hd,)) if bias else None
        self.bk = W(p + "k_proj.bias", (Hk * hd,)) if bias else None
        self.bv = W(p + "v_proj.bias", (Hk * hd,)) if bias else None
        self.wg = W(p + "g_proj.weight", (Hq * 3, D))
        self.wo = W(p + "o_proj.weight", (D, Hq * hd))
        self.margins = []

    def init_state(self, dt):
        return {"k": torch.zeros(0, self.Hk, self.hd, dtype=dt), "v": torch.zeros(0, self.Hk, self.hd, dtype=dt)}

    def __call__(self, x, st, pos0, mode):
        T = x.shape[0]
        q = linear(x, self.wq, self.bq).view(T, self.Hq, self.hd)
        k = linear(x, self.wk, self.bk).view(T, self.Hk, self.hd)
        v = linear(x, self.wv, self.bv).view(T, self.Hk, self.hd)
        g = linear(x, self.wg).view(T, self.Hq, 3)
        pos = torch.arange(pos0, pos0 + T)
        q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)
        st["k"], st["v"] = torch.cat([st["k"], k], 0), torch.cat([st["v"], v], 0)
        o, m = nsa_attend(q, st["k"], st["v"], g, self.block, self.counts, self.window, self.hd ** -0.5)
        self.margins.extend(m)
        return linear(o.reshape(T, self.Hq * self.hd), self.wo)


class Mamba2Layer:
    """Mamba2 mixer (MODELS.md 4.6): in_proj -> [z | xBC | dt], conv + silu on xBC, SSD, gated
    RMSNorm with z (gate before the norm; per group or over all channels), out_proj."""
    kind = "mamba2"

    def __init__(self, cfg, W, p, D):
        self.N = cfg.get("state_size", 128)
        self.G = cfg.get("n_groups", 8)
        self.P = cfg.get("head_dim", 64)
        self.K = cfg.get("conv_kernel", 4)
        self.I = int(cfg.get("expand", 2) * D)
        self.H = cfg.get("num_heads", None) or self.I // self.P
        assert self.H * self.P == self.I and self.H % self.G == 0
        self.eps = cfg.get("layer_norm_epsilon", 1e-5)
        # the gated norm: per group of I/G (FLA's config, or norm_grouped) or over all I
        # (transformers' MambaRMSNormGated) -- MODELS.md 4.6
        self.ng = self.G if cfg.get("norm_grouped", "norm_before_gate" in cfg) else 1
        lim = cfg.get("time_step_limit", None) or [0.0, None]
        self.lo = 0.0 if lim[0] is None else float(lim[0])
        self.hi = float("inf") if lim[1] is None else float(lim[1])
        I, N, G, H, K = self.I, self.N, self.G, self.H, self.K
        self.Cc = I + 2 * G * N
        Din = I + self.Cc + H
        bias = cfg.get("use_bias", False)
        self.win = W(p + "in_proj.weight", (Din, D))
        self.bin = W(p + "in_proj.bias", (Din,)) if bias else None
        self.cw = W(p + "conv1d.weight", (self.Cc, 1, K))
        self.cb = W(p + "conv1d.bias", (self.Cc,)) if cfg.get("use_conv_bias", True) else None
        self.dt_bias, self.A_log, self.Dsk = W(p + "dt_bias", (H,)), W(p + "A_log", (H,)), W(p + "D", (H,))
        self.nw = W(p + "norm.weight", (I,))
        self.wo = W(p + "out_proj.weight", (D, I))
        self.bo = W(p + "out_proj.bias", (D,)) if bias else None

    def init_state(self, dt):
        return {"S": torch.zeros(self.H, self.N, self.P, dtype=dt), "conv": torch.zeros(self.K - 1, self.Cc, dtype=dt)}

    def _inputs(self, x, st):
        """in_proj, the short conv and the gates: z, x per head, B and C per head, dt', a."""
        T, I, N, G, H, P = x.shape[0], self.I, self.N, self.G, self.H, self.P
        zxd = linear(x, self.win, self.bin)
        z, xbc, dt = zxd[:, :I], zxd[:, I:I + self.Cc], zxd[:, I + self.Cc:]
        xbc, st["conv"] = short_conv(xbc, self.cw, self.cb, st["conv"])
        xs = xbc[:, :I].reshape(T, H, P)
        rep = H // G
        Bm = xbc[:, I:I + G * N].reshape(T, G, N).repeat_interleave(rep, dim=1)
        Cm = xbc[:, I + G * N:].reshape(T, G, N).repeat_interleave(rep, dim=1)
        dtp = torch.clamp(torch.nn.functional.softplus(dt + self.dt_bias), self.lo, self.hi)   # [M2-1]
        a = -torch.exp(self.A_log) * dtp
        return z, xs, Bm, Cm, dtp, a

    def _output(self, y, z):
        """The gate, the grouped RMSNorm and out_proj of y [T][H][P]."""
        T, I = z.shape
        u = y.reshape(T, I) * torch.nn.functional.silu(z)                                      # [M2-3]
        u = rmsnorm(u.view(T, self.ng, I // self.ng), None, self.eps).reshape(T, I) * self.nw
        return linear(u, self.wo, self.bo)

    def __call__(self, x, st, pos0, mode):
        z, xs, Bm, Cm, dtp, a = self._inputs(x, st)
        fn = ssd_recurrent if mode == "recurrent" else (lambda *q: ssd_chunked(*q, pos0=pos0))
        y, st["S"] = fn(xs, Bm, Cm, dtp, a, self.Dsk, st["S"])                                 # [M2-2]
        return self._output(y, z)


class DLAMamba2Layer(Mamba2Layer):
    """Dynamic linear attention over Mamba2 (docs/MODELS.md 4.7): Mamba2's projections, conv and
    output stage, the state cache in place of one SSD state. The transition is Mamba2's scalar
    decay per head with no erase: q = C, k = B of the head's group, v = x, g = a, w = dt', scale 1;
    the D skip is added to the cache's read."""
    kind = "dla-mamba2"

    def __init__(self, cfg, W, p, D):
        super().__init__(cfg, W, p, D)
        self.cap = cfg.get("dla_capacity", 30)
        self.tau = cfg.get("dla_threshold", 0.6)
        self.wl = W(p + "l_proj.weight", (self.H * self.cap, D))
        self.bl = W(p + "l_proj.bias", (self.H * self.cap,))
        self.margins = []

    def init_state(self, dt):
        st = super().init_state(dt)
        del st["S"]
        st["cache"] = [{"S": [], "n": [], "I": []} for _ in range(self.H)]
        return st

    def __call__(self, x, st, pos0, mode):
        z, xs, Bm, Cm, dtp, a = self._inputs(x, st)
        T, H = x.shape[0], self.H
        lam = linear(x, self.wl, self.bl).view(T, H, self.cap)
        y = dla_recurrent(Cm, Bm, xs, a, torch.zeros_like(a), dtp, lam, st["cache"], 1.0, self.cap, self.tau,
                          self.margins)
        y = y + self.Dsk[:, None] * xs                                                         # [M2-2]
        return self._output(y, z)


# ----------------------------------------------------------------------------------------
# model and session
# ----------------------------------------------------------------------------------------

def attn_specs(cfg):
    a = cfg.get("attn", None)
    if a is None:
        return []
    return a if isinstance(a, list) else [a]


def _special_floats(v):
    """transformers 5 writes inf as {"__float__": "Infinity"} (MODELS.md 4.6): decode it."""
    if isinstance(v, dict):
        if set(v) == {"__float__"} and v["__float__"] in ("Infinity", "-Infinity", "NaN"):
            return float(v["__float__"].replace("Infinity", "inf").replace("NaN", "nan"))
        return {k: _special_floats(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_special_floats(x) for x in v]
    return v


class Model:
    def __init__(self, model_dir, dtype=torch.float64):
        cfg, raw = load_model_dir(model_dir)
        cfg = _special_floats(cfg)
        self.cfg, self.dtype = cfg, dtype
        W = Weights(raw, dtype)
        mt = cfg["model_type"]
        if mt not in ("gla", "gated_deltanet", "transformer", "sse", "nsa", "mamba2", "dla_gated_deltanet", "dla_mamba2"):
            raise ValueError("unknown model_type %r" % mt)
        D, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
        self.D, self.V, self.L = D, V, L
        self.eps = cfg.get("norm_eps", 1e-6)
        m2 = mt in ("mamba2", "dla_mamba2")  # the Mamba2 family (MODELS.md 4.6): its own layout
        if m2:
            self.eps = cfg.get("layer_norm_epsilon", 1e-5)
        if cfg.get("hidden_act", "swish") not in ("swish", "silu"):
            raise ValueError("hidden_act must be swish")
        F = cfg.get("intermediate_size", None)
        if F is None:
            F = int(D * cfg.get("hidden_ratio", 4) * 2 / 3)
            F = 256 * ((F + 255) // 256)
        self.F = F
        self.emb = W("backbone.embeddings.weight" if m2 else "model.embeddings.weight", (V, D))
        attn_of = {}
        for spec in attn_specs(cfg):
            for i in spec.get("layers", []):
                attn_of[i] = spec
        lte_of, nsa_of = {}, {}  # sparse-attention specs
        for key, of in (("lte", lte_of), ("nsa", nsa_of)):
            sp = cfg.get(key, None)
            for spec in ([] if sp is None else sp if isinstance(sp, list) else [sp]):
                for i in spec.get("layers", []):
                    of[i] = spec
        # StateX (docs/MODELS.md 4.5): listed layers read the root keys overlaid by the spec's
        cfg_of = {}
        sx = cfg.get("statex", None)
        for spec in ([] if sx is None else sx if isinstance(sx, list) else [sx]):
            over = dict(cfg)
            over.update({k: v for k, v in spec.items() if k != "layers"})
            for i in spec.get("layers", []):
                cfg_of[i] = over
        self.layers = []
        for i in range(L):
            p = "model.layers.%d." % i
            pa = p + "attn."
            if m2:
                p = "backbone.layers.%d." % i
                pa = p + "mixer."
                m2cls = DLAMamba2Layer if mt == "dla_mamba2" else Mamba2Layer
                mix = AttnLayer(attn_of[i], W, pa, D, False) if i in attn_of else m2cls(cfg_of.get(i, cfg), W, pa, D)
                self.layers.append({"mixer": mix, "attn_norm": W(p + "norm.weight", (D,)), "mlp_norm": None})
                continue
            if mt == "transformer":
                mix = AttnLayer(cfg, W, pa, D, True)
            elif i in attn_of:
                mix = AttnLayer(attn_of[i], W, pa, D, False)
            elif mt == "nsa":
                mix = NSALayer(cfg, W, pa, D, False)
            elif i in lte_of:
                mix = LTELayer(lte_of[i], W, pa, D)
            elif i in nsa_of:
                mix = NSALayer(nsa_of[i], W, pa, D, True)
            elif mt == "gla":
                mix = GLALayer(cfg_of.get(i, cfg), W, pa, D)
            elif mt == "gated_deltanet":
                mix = GDNLayer(cfg_of.get(i, cfg), W, pa, D)
            elif mt == "dla_gated_deltanet":
                mix = DLAGDNLayer(cfg, W, pa, D)
            else:
                mix = SSELayer(cfg_of.get(i, cfg), W, pa, D)
            self.layers.append({
                "mixer": mix,
                "attn_norm": W(p + "attn_norm.weight", (D,)),
                "mlp_norm": W(p + "mlp_norm.weight", (D,)),
                "gate": W(p + "mlp.gate_proj.weight", (F, D)),
                "up": W(p + "mlp.up_proj.weight", (F, D)),
                "down": W(p + "mlp.down_proj.weight", (D, F)),
            })
        self.norm = W("backbone.norm_f.weight" if m2 else "model.norm.weight", (D,))
        if cfg.get("tie_word_embeddings", False):
            self.head = self.emb
        else:
            self.head = W("lm_head.weight", (V, D))
        self.unused = sorted(set(raw) - W.used)

    def kinds(self):
        return [l["mixer"].kind for l in self.layers]

    def route_margins(self):
        m = []
        for l in self.layers:
            m.extend(getattr(l["mixer"], "margins", []))
        return m


class Session:
    def __init__(self, model):
        self.m = model
        self.pos = 0
        self.state = [l["mixer"].init_state(model.dtype) for l in model.layers]

    def forward(self, tokens, mode="recurrent"):
        """Feeds tokens (list of ids) at positions pos..pos+T-1; returns logits [T, V].
        mode: 'recurrent' (token by token, the definition), 'chunked' (chunked GLA/GDN forms,
        SSE grouped by partition = the paper's varlen prefill) or 'varlen' (SSE grouped by
        partition but each partition run by the recurrence)."""
        m = self.m
        x = m.emb[torch.tensor(tokens, dtype=torch.long)]
        for l, st in zip(m.layers, self.state):
            mix = l["mixer"]
            mmode = mode
            if mode == "varlen":
                mmode = "varlen" if mix.kind == "sse" else "recurrent"
            h = x + mix(rmsnorm(x, l["attn_norm"], m.eps), st, self.pos, mmode)
            if l["mlp_norm"] is None:  # mixer-only layers (Mamba2)
                x = h
                continue
            y = rmsnorm(h, l["mlp_norm"], m.eps)
            x = h + linear(torch.nn.functional.silu(linear(y, l["gate"])) * linear(y, l["up"]), l["down"])
        self.pos += len(tokens)
        return linear(rmsnorm(x, m.norm, m.eps), m.head)


def argmax_lowest(row):
    """[SAMPLE-1] greedy: argmax, lowest index on ties."""
    r = row.detach().cpu().numpy()
    return int(np.flatnonzero(r == r.max())[0])


def generate(model, prompt, n, mode="recurrent"):
    """Prefills prompt (mode), then decodes n greedy tokens one at a time by the recurrence.
    Returns (prompt logits [P, V] float64 numpy, generated ids, per-step top-2 gap list).
    Generation does not stop at eos; callers decide."""
    s = Session(model)
    lg = s.forward(prompt, mode)
    plog = lg.detach().cpu().numpy().astype(np.float64)
    out, gaps = [], []
    last = lg[-1]
    for _ in range(n):
        t = argmax_lowest(last)
        srt = torch.sort(last, descending=True).values
        gaps.append(float(srt[0] - srt[1]))
        out.append(t)
        last = s.forward([t], "recurrent")[-1]
    return plog, out, gaps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--ids", action="store_true")
    ap.add_argument("--dump-logits")
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--prefill", default="recurrent", choices=["recurrent", "chunked", "varlen"])
    a = ap.parse_args()
    torch.set_num_threads(1)
    model = Model(a.model, getattr(torch, a.dtype))
    for n in model.unused:
        print("warning: unused tensor %s" % n, file=sys.stderr)
    prompt = [int(t) for t in a.prompt_ids.split()]
    plog, out, _ = generate(model, prompt, a.max_tokens, a.prefill)
    margins = model.route_margins()
    if margins:  # SSE routing, NSA selection, DLA merge/open: how far the closest decision was from flipping
        print("smallest decision margin: %.3g (%d decisions)" % (min(margins), len(margins)), file=sys.stderr)
    if a.dump_logits:
        plog.astype("<f4").tofile(a.dump_logits)
    if a.ids:
        print(" ".join(str(t) for t in out))
    else:
        print(bytes(t for t in out if t < 256).decode("utf-8", "replace"))


if __name__ == "__main__":
    main()
