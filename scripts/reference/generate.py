#!/usr/bin/env python3
"""Golden-data generator for cpfill: tiny random DeepSeek-V4 models run through Hugging Face
transformers (5.17, float32, eager attention) to produce the reference outputs that the C++
engine is tested against (tests/data/<fixture>/).

For each fixture it writes
  config.json, model.safetensors (+ whatever else save_pretrained writes)
      exactly as `model.save_pretrained(dir, safe_serialization=True)` writes them;
  reference.safetensors
      input ids, all-position logits, every element of `output_hidden_states`, the lightning
      indexer's top-k per CSA layer, router choices per layer, and a few debugging extras,
      with __metadata__ (versions, seed, semantics of each tensor).
See README.md next to this file for the fixture list, tensor names and semantics.

Weights are re-initialised at unit scale (HF's std-0.02 init makes every layer a no-op) and
rounded to bf16-representable values; tensors that are bf16/fp8 in the real checkpoints are
saved as bf16, the ones that are fp32 there (mHC, sinks, position biases, router bias) as fp32.
The forward itself runs in float32 on those exact values.

Self-checks (the run fails if one fails): shapes, finiteness, what output_hidden_states holds,
HF's attention-probability zero pattern against the spec's masks, no near-ties in any top-k
(inputs are redrawn until there are none), save -> from_pretrained round trip reproduces the
logits. Diagnostics (reported, never fatal): an independent re-implementation of the spec
(spec_forward.py) in fp64/fp32 vs HF layer by layer, config-folding of legacy keys, chunked
prefill through HF's cache vs one shot.

Usage (GPU machine image: Python 3.12, torch 2.11, transformers 5.17, safetensors 0.8):
  python3 scripts/reference/generate.py [--out-dir tests/data] [--tar fixtures.tar]
                                        [--fixtures dsv4_tiny_a,dsv4_tiny_b] [--device cpu]
"""

import argparse
import json
import math
import os
import platform
import sys
import tarfile
import time
import zlib

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spec_forward  # noqa: E402

GENERATOR_VERSION = "cpfill-golden-1"
TIE_REL = 2e-5  # minimum relative gap between the k-th and (k+1)-th candidate of any top-k
MAX_DRAWS = 60  # input redraws allowed to get rid of near-ties
CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"

# Shared by every fixture: the real models' values for everything the brief asks to keep.
COMMON = dict(
    head_dim=512,  # 448 nope + 64 rope (partial_rotary_factor 0.125, HF default)
    num_key_value_heads=1,
    sliding_window=128,
    hc_mult=4,
    hc_sinkhorn_iters=20,
    hc_eps=1e-6,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    max_position_embeddings=1048576,  # HF's yarn derives factor = this / 65536 = 16
    index_head_dim=128,  # 64 nope + 64 rope, as in the real models
    n_shared_experts=1,
    scoring_func="sqrtsoftplus",
    norm_topk_prob=True,
    tie_word_embeddings=False,
    hidden_act="silu",
    # Flat YaRN parameters; DeepseekV4Config.__post_init__ folds them into
    # rope_parameters["compress"] (+ rope_theta 160000, attention_factor 1.0) and builds
    # rope_parameters["main"] (default rope, theta 10000). Asserted after construction.
    rope_parameters=dict(rope_type="yarn", factor=16.0, original_max_position_embeddings=65536,
                         beta_fast=32.0, beta_slow=1.0),
)

FIXTURES = {
    # Main fixture, with debugging extras. hidden_size 48 and q_lora_rank 24: deliberately not
    # powers of two (catches kernels that assume them).
    "dsv4_tiny_a": dict(
        seed=1234,
        lengths=[301],
        extras=("router", "indexer_scores", "indexer_keys", "compressed_kv"),
        extras_layers=(1, 2),  # compressor/indexer extras for the first CSA and HCA layer only
        config=dict(
            vocab_size=512, hidden_size=48, num_hidden_layers=5,
            layer_types=[SWA, CSA, HCA, CSA, HCA],
            mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"],
            num_attention_heads=4, o_groups=2, q_lora_rank=24, o_lora_rank=16,
            n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            routed_scaling_factor=1.5, swiglu_limit=10.0,
            index_n_heads=8, index_topk=8,
        ),
    ),
    # Other layer order, other sizes, two requests of different lengths (run separately).
    # swiglu_limit 1.5 (real: 10) so that the SwiGLU clamps are actually exercised.
    "dsv4_tiny_b": dict(
        seed=4321,
        lengths=[270, 141],
        extras=("router",),
        config=dict(
            vocab_size=256, hidden_size=32, num_hidden_layers=4,
            layer_types=[HCA, CSA, SWA, CSA],
            mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
            num_attention_heads=2, o_groups=2, q_lora_rank=32, o_lora_rank=32,
            n_routed_experts=6, num_experts_per_tok=3, moe_intermediate_size=24,
            routed_scaling_factor=2.5, swiglu_limit=1.5,
            index_n_heads=8, index_topk=16,
        ),
    ),
}

# Parameters stored fp32 in the real checkpoints (and kept fp32 by HF); all others are bf16/fp8
# there and are saved as bf16 here.
F32_PARAMS = ("attn_hc.", "ffn_hc.", "hc_head.", ".sinks", "position_bias", "e_score_correction_bias")

LOG = []


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.append(s)


def rel(a, b):
    """max |a-b| / max |b| (0 for empty)."""
    a, b = a.double().cpu(), b.double().cpu()
    if b.numel() == 0:
        return 0.0
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


# --------------------------------------------------------------------------------------------
# model construction


def build_config(fx):
    from transformers import DeepseekV4Config

    cfg = DeepseekV4Config(**{**COMMON, **fx["config"]})
    rp = cfg.rope_parameters
    comp, main = rp["compress"], rp["main"]
    assert comp["rope_type"] == "yarn" and float(comp["factor"]) == 16.0, rp
    assert comp["original_max_position_embeddings"] == 65536, rp
    assert float(comp["beta_fast"]) == 32.0 and float(comp["beta_slow"]) == 1.0, rp
    assert float(comp.get("attention_factor", 0)) == 1.0, rp
    assert float(comp["rope_theta"]) == 160000.0 and float(main["rope_theta"]) == 10000.0, rp
    assert main["rope_type"] == "default", rp
    assert cfg.qk_rope_head_dim == 64, cfg.qk_rope_head_dim
    assert cfg.layer_types == fx["config"]["layer_types"]
    assert cfg.mlp_layer_types == fx["config"]["mlp_layer_types"]
    assert cfg.compress_rates == {CSA: 4, HCA: 128}, cfg.compress_rates
    return cfg


def build_model(cfg, device):
    from transformers import DeepseekV4ForCausalLM

    try:
        cfg._attn_implementation = "eager"
    except Exception as e:  # noqa: BLE001
        log("note: could not preset _attn_implementation:", e)
    model = DeepseekV4ForCausalLM(cfg)
    if getattr(model.config, "_attn_implementation", None) != "eager":
        model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    for setter in ("set_experts_implementation",):
        if hasattr(model, setter):
            try:
                getattr(model, setter)("eager")
            except Exception as e:  # noqa: BLE001
                log(f"note: {setter}('eager') failed: {e}")
    log("attn implementation:", model.config._attn_implementation,
        "| experts implementation:", getattr(model.config, "_experts_implementation", "n/a"))
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr(), "tied?"
    return model.to(device).eval()


def is_f32_param(name):
    return any(k in name for k in F32_PARAMS)


def new_value(name, t, cfg, g):
    """Deterministic unit-scale value for one persistent tensor (HF module name)."""
    shape = tuple(t.shape)

    def randn(*s):
        return torch.randn(*(s or shape), generator=g, dtype=torch.float32)

    if name.endswith("gate.tid2eid"):  # [V, k] distinct experts per row
        E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
        return torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(shape[0])]).to(t.dtype)
    if name.endswith("e_score_correction_bias"):
        return 0.1 * randn()
    if name.endswith(".sinks"):
        return randn()
    if name.endswith("position_bias"):
        return 0.5 * randn()
    if name.endswith(("attn_hc.fn", "ffn_hc.fn", "hc_head.hc_fn")):
        return 0.5 * randn() / math.sqrt(shape[-1])
    if name.endswith(("attn_hc.base", "ffn_hc.base")):  # [pre N | post N | comb N*N]
        n = cfg.hc_mult
        v = 0.5 * randn()
        v[2 * n:] = randn(n * n)  # comb logits spread enough for a clearly non-symmetric comb
        return v
    if name.endswith("hc_head.hc_base"):
        return 0.5 * randn()
    if name.endswith(("attn_hc.scale", "ffn_hc.scale", "hc_head.hc_scale")):
        return 1.0 + 0.25 * randn()
    if name.endswith("embed_tokens.weight"):
        return randn()
    if name.endswith("norm.weight") and len(shape) == 1:
        return 1.0 + 0.1 * randn()
    if len(shape) >= 2:  # every linear / expert matrix, incl. lm_head: N(0, 1/fan_in)
        return randn() / math.sqrt(shape[-1])
    raise KeyError(f"no init rule for {name} {shape}")


@torch.no_grad()
def reinit(model, cfg, seed):
    n = 0
    for name, t in model.state_dict(keep_vars=True).items():  # persistent tensors only
        g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        v = new_value(name, t, cfg, g)
        if v.is_floating_point() and not is_f32_param(name):
            v = v.to(torch.bfloat16).to(torch.float32)  # bf16-exact, saved as bf16 later
        t.copy_(v.to(t.device, t.dtype))
        n += 1
    log(f"re-initialised {n} tensors (seed {seed})")


# --------------------------------------------------------------------------------------------
# running HF with captures


def attach_hooks(model, cfg, cap):
    hooks = []
    for l, layer in enumerate(model.model.layers):
        lt = cfg.layer_types[l]

        def out_hook(m, a, o, l=l):
            cap[f"layer_out_{l}"] = o[0].detach().clone()

        hooks.append(layer.register_forward_hook(out_hook))
        comp = layer.self_attn.compressor
        if comp is not None:
            def comp_hook(m, a, o, l=l):
                cap[f"compressed_kv_{l}"] = o[0][0, 0].detach().clone()  # [T, head_dim]
            hooks.append(comp.register_forward_hook(comp_hook))
        if lt == CSA:
            def idx_hook(m, a, o, l=l):
                cap[f"indexer_topk_{l}"] = o[0].detach().clone()  # [S, k], -1 = ineligible

            def scorer_hook(m, a, kw, o, l=l):
                keys = a[1] if len(a) > 1 else kw["compressed_kv"]
                cap[f"indexer_scores_{l}"] = o[0].detach().clone()  # [S, T] before masking
                cap[f"indexer_keys_{l}"] = keys[0].detach().clone()  # [T, index_head_dim]

            hooks.append(comp.indexer.register_forward_hook(idx_hook))
            hooks.append(comp.indexer.scorer.register_forward_hook(scorer_hook, with_kwargs=True))

        def router_hook(m, a, o, l=l):
            logits, weights, idx = o
            cap[f"router_logits_{l}"] = logits.detach().clone()
            cap[f"router_weights_{l}"] = weights.detach().clone()
            cap[f"router_indices_{l}"] = idx.detach().clone()
            if hasattr(m, "e_score_correction_bias"):
                cap[f"router_select_{l}"] = (m.score_fn(logits) + m.e_score_correction_bias).detach()

        hooks.append(layer.mlp.gate.register_forward_hook(router_hook))
    return hooks


@torch.no_grad()
def run_hf(model, cfg, ids, device):
    cap = {}
    hooks = attach_hooks(model, cfg, cap)
    try:
        out = model(input_ids=ids[None].to(device), use_cache=False,
                    output_hidden_states=True, output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    cap["logits"] = out.logits[0].detach().float().cpu()
    cap["hidden_states"] = [h[0].detach().float().cpu() for h in out.hidden_states]
    cap["attentions"] = [a[0].detach().float().cpu() if a is not None else None
                         for a in out.attentions]
    for k, v in list(cap.items()):
        if torch.is_tensor(v):
            cap[k] = v.cpu()
    return cap


def topk_gaps(cand, k):
    """Relative gap between k-th and (k+1)-th largest entry of each row (inf if <= k)."""
    if cand.shape[-1] <= k:
        return torch.full(cand.shape[:-1], float("inf"))
    v = cand.double().sort(dim=-1, descending=True).values
    return (v[..., k - 1] - v[..., k]) / v.abs().max(dim=-1).values.clamp_min(1e-30)


def tie_report(cap, cfg, S):
    """Smallest top-k margins of this run; a margin < TIE_REL makes the fixture ambiguous."""
    worst = {}
    t = torch.arange(S)
    for l, lt in enumerate(cfg.layer_types):
        if lt == CSA:
            sc = cap[f"indexer_scores_{l}"].double()
            T = sc.shape[1]
            k = min(cfg.index_topk, T)
            n_elig = ((t + 1) // 4).clamp(max=T)
            gaps = [topk_gaps(sc[i, : n_elig[i]], k).item() for i in range(S) if n_elig[i] > k]
            worst[f"indexer_{l}"] = min(gaps) if gaps else float("inf")
        if cfg.mlp_layer_types[l] == "moe":
            worst[f"router_{l}"] = topk_gaps(cap[f"router_select_{l}"], cfg.num_experts_per_tok).min().item()
    return worst


def draw_ids(seed, attempt, r, S, V):
    g = torch.Generator().manual_seed(seed * 7919 + attempt * 101 + r)
    return torch.randint(0, V, (S,), generator=g, dtype=torch.int64)


# --------------------------------------------------------------------------------------------
# checks


def check_shapes_and_sanity(cap, cfg, ids, log_prefix):
    S, V, D, N, L = ids.numel(), cfg.vocab_size, cfg.hidden_size, cfg.hc_mult, cfg.num_hidden_layers
    lg = cap["logits"]
    assert lg.shape == (S, V) and torch.isfinite(lg).all(), lg.shape
    hs = cap["hidden_states"]
    assert len(hs) == L + 1, f"output_hidden_states has {len(hs)} elements, expected {L + 1}"
    for i, h in enumerate(hs[:-1]):
        assert h.shape == (S, N, D), (i, h.shape)
    assert hs[-1].shape == (S, D), hs[-1].shape
    assert all(torch.isfinite(h).all() for h in hs)
    # what output_hidden_states holds (documented in README / metadata)
    assert torch.equal(hs[0], hs[0][:, :1].expand(-1, N, -1)), "hs[0] is not 4 copies"
    for i in range(1, L):
        assert torch.equal(hs[i], cap[f"layer_out_{i - 1}"].float()), f"hs[{i}] != layer {i-1} out"
    assert torch.isfinite(cap[f"layer_out_{L - 1}"]).all()
    # logits not degenerate
    assert lg.std(dim=0).mean() > 0.05 and lg.std(dim=1).mean() > 0.05, "degenerate logits"
    n_arg = lg.argmax(-1).unique().numel()
    assert n_arg >= 5, f"only {n_arg} distinct argmax tokens"
    rms = [h.pow(2).mean().sqrt().item() for h in hs[:-1]] + [
        cap[f"layer_out_{L - 1}"].pow(2).mean().sqrt().item()]
    spread = [((h - h.mean(1, keepdim=True)).pow(2).mean().sqrt() / h.pow(2).mean().sqrt()).item()
              for h in hs[1:-1]]
    log(f"{log_prefix} S={S} residual RMS after embed/each layer: " + " ".join(f"{r:.3f}" for r in rms))
    log(f"{log_prefix} stream spread (rms(h-mean_streams)/rms(h)) per layer: "
        + " ".join(f"{s:.3f}" for s in spread))
    assert all(0.05 < r < 100 for r in rms), f"residual scale out of range: {rms}"
    log(f"{log_prefix} logits mean {lg.mean():.3f} std {lg.std():.3f} |max| {lg.abs().max():.2f}; "
        f"{n_arg} distinct argmax tokens; final hidden RMS {hs[-1].pow(2).mean().sqrt():.3f}")
    # indexer selections
    t = torch.arange(S)
    for l, lt in enumerate(cfg.layer_types):
        if lt != CSA:
            continue
        top = cap[f"indexer_topk_{l}"]
        T = cap[f"compressed_kv_{l}"].shape[0]
        k = min(cfg.index_topk, T)
        assert top.shape == (S, k) and top.dtype == torch.int64, top.shape
        n_elig = ((t + 1) // 4).clamp(max=T)
        valid = top >= 0
        assert torch.equal(valid.sum(1), n_elig.clamp(max=k)), "valid count != min(eligible, k)"
        assert (top[valid] < n_elig[:, None].expand_as(top)[valid]).all(), "ineligible pick"
        sparse = n_elig > k
        recent = 0
        for i in torch.nonzero(sparse).flatten().tolist():
            ne = int(n_elig[i])
            recent += set(top[i].tolist()) == set(range(ne - k, ne))
        n_sp = int(sparse.sum())
        assert n_sp > 0, "indexer never selects (prompt too short)"
        log(f"{log_prefix} CSA layer {l}: T={T} k={k}; {n_sp}/{S} queries select k of more "
            f"than k eligible; {recent} of them picked exactly the most recent k")
        assert recent < n_sp, "indexer trivially picks the most recent entries"


def check_attention_masks(cap, cfg, S, log_prefix):
    """HF's attention probabilities must be exactly 0 where the spec's masks forbid a key."""
    t = torch.arange(S)
    W = cfg.sliding_window
    win = ((t[:, None] - t[None, :]) >= 0) & ((t[:, None] - t[None, :]) < W)
    msgs = []
    for l, lt in enumerate(cfg.layer_types):
        p = cap["attentions"][l]
        if p is None:
            raise AssertionError("attentions not returned (not eager?)")
        allowed = win
        if lt != SWA:
            T = cap[f"compressed_kv_{l}"].shape[0]
            if lt == HCA:
                sel = torch.arange(T)[None, :] < ((t + 1) // 128)[:, None]
            else:
                top = cap[f"indexer_topk_{l}"]
                sel = torch.zeros(S, T + 1, dtype=torch.bool)
                sel.scatter_(1, torch.where(top >= 0, top, torch.full_like(top, T)), True)
                sel = sel[:, :T]
            allowed = torch.cat([win, sel], 1)
        assert p.shape[-2:] == allowed.shape, (p.shape, allowed.shape)
        bad = (p[:, ~allowed] != 0).sum().item()
        underflow = (p[:, allowed] == 0).sum().item()
        assert bad == 0, f"layer {l}: {bad} nonzero probabilities on masked keys"
        msgs.append(f"L{l}:{underflow}")
    log(f"{log_prefix} attention zero-pattern == spec masks in every layer "
        f"(allowed-but-underflowed probs: {' '.join(msgs)})")


def spec_check(model, cfg, ids, cap, log_prefix):
    """Diagnostic: independent spec implementation (fp64 and fp32) vs HF, layer by layer."""
    P = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    c = cfg.to_dict()
    L = cfg.num_hidden_layers
    summary = {}
    for dt in (torch.float64, torch.float32):
        t0 = time.time()
        r = spec_forward.forward(P, c, ids.cpu(), dt)
        name = "fp64" if dt == torch.float64 else "fp32"
        errs = [rel(r["streams"][i], cap["hidden_states"][i]) for i in range(L)]
        errs.append(rel(r["streams"][L], cap[f"layer_out_{L - 1}"]))
        e_final = rel(r["final"], cap["hidden_states"][L])
        e_log = rel(r["logits"], cap["logits"])
        sel_mism = 0
        for l, lt in enumerate(cfg.layer_types):
            if lt == CSA:
                a = r[f"indexer_topk_{l}"].sort(-1).values
                b = cap[f"indexer_topk_{l}"].sort(-1).values
                sel_mism += (a != b).any(-1).sum().item()
            ra = r[f"router_indices_{l}"].sort(-1).values
            rb = cap[f"router_indices_{l}"].sort(-1).values
            sel_mism += (ra != rb).any(-1).sum().item()
        summary[name] = dict(streams=errs, final=e_final, logits=e_log, selection_mismatch=sel_mism)
        log(f"{log_prefix} spec[{name}] vs HF ({time.time() - t0:.1f}s): max rel err of streams "
            f"after embed/each layer " + " ".join(f"{e:.1e}" for e in errs)
            + f"; final {e_final:.1e}; logits {e_log:.1e}; rows with different top-k sets {sel_mism}")
        if name == "fp64":
            hf_inv = {k: getattr(model.model.rotary_emb, f"{k}_inv_freq").double().cpu()
                      for k in ("main", "compress")}
            for k in hf_inv:
                log(f"{log_prefix} rope inv_freq[{k}] HF vs spec formula: rel err "
                    f"{rel(hf_inv[k], r['inv_freq'][k]):.1e}")
            for l, lt in enumerate(cfg.layer_types):
                if lt != SWA:
                    log(f"{log_prefix}   compressed_kv_{l} rel err "
                        f"{rel(r[f'compressed_kv_{l}'], cap[f'compressed_kv_{l}']):.1e}"
                        + (f", indexer_keys {rel(r[f'indexer_keys_{l}'], cap[f'indexer_keys_{l}']):.1e}"
                           f", indexer_scores {rel(r[f'indexer_scores_{l}'], cap[f'indexer_scores_{l}']):.1e}"
                           if lt == CSA else ""))
    if summary["fp64"]["logits"] > 1e-4 or summary["fp64"]["selection_mismatch"]:
        log(f"{log_prefix} WARNING: HF differs from the spec implementation (see above)")
    return summary


@torch.no_grad()
def chunked_check(model, ids, cap, device, log_prefix):
    """Diagnostic: HF with its cache, one shot and in two chunks, vs the stateless one shot."""
    S = ids.numel()
    try:
        o = model(input_ids=ids[None].to(device), use_cache=True)
        log(f"{log_prefix} HF one-shot with cache vs without: logits rel err "
            f"{rel(o.logits[0].float(), cap['logits']):.1e}")
    except Exception as e:  # noqa: BLE001
        log(f"{log_prefix} HF one-shot with cache FAILED: {type(e).__name__}: {e}")
    c = (S // 2) | 1  # odd split point: not window aligned
    try:
        o1 = model(input_ids=ids[None, :c].to(device), use_cache=True)
        o2 = model(input_ids=ids[None, c:].to(device), past_key_values=o1.past_key_values,
                   position_ids=torch.arange(c, S, device=device)[None], use_cache=True)
        lg = torch.cat([o1.logits[0], o2.logits[0]]).float()
        log(f"{log_prefix} HF chunked prefill [0,{c}) + [{c},{S}) vs one shot: logits rel err "
            f"first chunk {rel(lg[:c], cap['logits'][:c]):.1e}, second chunk "
            f"{rel(lg[c:], cap['logits'][c:]):.1e}")
    except Exception as e:  # noqa: BLE001
        log(f"{log_prefix} HF chunked prefill FAILED: {type(e).__name__}: {e}")


def probe_config_folding():
    """Diagnostic: how DeepseekV4Config folds the legacy keys a real config.json ships."""
    from transformers import DeepseekV4Config

    base = dict(num_hidden_layers=4, vocab_size=64, hidden_size=32)
    legacy = dict(compress_ratios=[0, 4, 128, 4, 0], num_hash_layers=2, qk_rope_head_dim=64)
    tries = {
        "rope_scaling{type:yarn}": dict(rope_scaling=dict(type="yarn", factor=16,
                                        original_max_position_embeddings=65536, beta_fast=32,
                                        beta_slow=1)),
        "rope_scaling{rope_type:yarn}": dict(rope_scaling=dict(rope_type="yarn", factor=16,
                                             original_max_position_embeddings=65536,
                                             beta_fast=32, beta_slow=1)),
        "no rope keys": {},
    }
    for name, kw in tries.items():
        try:
            c = DeepseekV4Config(**base, **legacy, **kw)
            log(f"config folding [{name} + compress_ratios/num_hash_layers]: layer_types="
                f"{[x.split('_')[0] for x in c.layer_types]} mlp={c.mlp_layer_types} "
                f"rope_parameters={json.dumps(c.rope_parameters, sort_keys=True)}")
        except Exception as e:  # noqa: BLE001
            log(f"config folding [{name}]: FAILED {type(e).__name__}: {e}")


# --------------------------------------------------------------------------------------------
# writing


def save_reference(path, fx_name, fx, cfg, model, reqs, caps, seed, attempt, summaries, gaps, device):
    from safetensors.torch import save_file
    import safetensors
    import transformers

    multi = len(reqs) > 1
    out = {}

    def put(name, t, r):
        out[f"{name}_{r}" if multi else name] = t.detach().cpu().contiguous()

    for r, (ids, cap) in enumerate(zip(reqs, caps)):
        put("input_ids", ids.to(torch.int64), r)
        put("logits", cap["logits"].float(), r)
        for i, h in enumerate(cap["hidden_states"]):
            put(f"hidden_states_{i}", h.float(), r)
        for l, lt in enumerate(cfg.layer_types):
            dbg = l in fx.get("extras_layers", range(cfg.num_hidden_layers))
            if lt == CSA:
                put(f"indexer_topk_{l}", cap[f"indexer_topk_{l}"].to(torch.int64), r)
                if "indexer_scores" in fx["extras"] and dbg:
                    put(f"indexer_scores_{l}", cap[f"indexer_scores_{l}"].float(), r)
                if "indexer_keys" in fx["extras"] and dbg:
                    put(f"indexer_keys_{l}", cap[f"indexer_keys_{l}"].float(), r)
            if lt != SWA and "compressed_kv" in fx["extras"] and dbg:
                put(f"compressed_kv_{l}", cap[f"compressed_kv_{l}"].float(), r)
            if "router" in fx["extras"]:
                idx = cap[f"router_indices_{l}"].to(torch.int64)
                order = idx.argsort(-1)
                put(f"router_indices_{l}", idx.gather(-1, order), r)
                put(f"router_weights_{l}", cap[f"router_weights_{l}"].float().gather(-1, order), r)
    for k in ("main", "compress"):
        out[f"rope_inv_freq_{k}"] = getattr(model.model.rotary_emb, f"{k}_inv_freq").float().cpu().contiguous()

    L = cfg.num_hidden_layers
    suffix = "_<r> (request r)" if multi else ""
    meta = {
        "generator": GENERATOR_VERSION + " (scripts/reference/generate.py)",
        "fixture": fx_name,
        "seed": str(seed),
        "input_draw_attempt": str(attempt),
        "n_requests": str(len(reqs)),
        "request_lengths": ",".join(str(ids.numel()) for ids in reqs),
        "name_suffix": ("every per-request tensor name ends in _<r>, r = 0.." + str(len(reqs) - 1)
                        + "; each request was run separately (batch 1, no padding, positions from 0)")
                       if multi else "single request: no suffix",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "device": f"{device} fp32 (tf32 off), eager attention, use_cache=False, "
                  f"{torch.get_num_threads()} threads",
        "layer_types": ",".join(cfg.layer_types),
        "mlp_layer_types": ",".join(cfg.mlp_layer_types),
        "input_ids" + suffix: "int64 [S], uniform random in [0, vocab)",
        "logits" + suffix: "f32 [S, V], every position (logits_to_keep=0)",
        "hidden_states_<i>" + suffix: (
            f"f32; HF output_hidden_states element i (i = 0..{L}): i=0: [S, hc, D] mHC streams "
            f"after the embedding (hc identical copies); i=1..{L - 1}: [S, hc, D] streams after "
            f"decoder layer i-1; i={L}: [S, D] final hidden after hc_head + norm (what lm_head "
            f"reads). The output of the last decoder layer ({L - 1}) is NOT included (HF "
            f"overwrites it with last_hidden_state)."),
        "indexer_topk_<layer>" + suffix: (
            "int64 [S, k], k = min(index_topk, floor(S/4)): the CSA layer's "
            "DeepseekV4Indexer output captured with a forward hook, in HF's order (descending "
            "score, torch.topk), -1 = ineligible slot (query t has only floor((t+1)/4) "
            "eligible entries); compare as sets"),
        "router_indices_<layer>" + suffix: (
            "int64 [S, top_k] chosen experts, sorted ascending by expert id per row (HF uses "
            "topk(sorted=False): order unspecified); hash layers: tid2eid[token]"),
        "router_weights_<layer>" + suffix: (
            "f32 [S, top_k] routing weights (normalised, times routed_scaling_factor), same order "
            "as router_indices"),
        "indexer_scores_<layer>" + suffix: (
            "f32 [S, T] lightning-indexer scores for every (query, entry) pair BEFORE the causal "
            "mask (captured at DeepseekV4IndexerScorer's output)"),
        "indexer_keys_<layer>" + suffix: "f32 [T, index_head_dim] indexer compressed keys (after kv_norm + RoPE)",
        "compressed_kv_<layer>" + suffix: "f32 [T, head_dim] main compressor entries (after kv_norm + RoPE at position w*ratio)",
        "rope_inv_freq_main": "f32 [32] HF's inverse frequencies, sliding layers (theta 10000)",
        "rope_inv_freq_compress": "f32 [32] HF's inverse frequencies, CSA/HCA layers (theta 160000 + YaRN, no mscale)",
        "top_k_min_relative_margin": json.dumps({k: float(f"{v:.3g}") for k, v in gaps.items()}),
        "spec_check": json.dumps(summaries, default=lambda x: float(f"{x:.3g}")),
        "weights": ("unit-scale random (see generate.py new_value), bf16-exact; bf16 in "
                    "model.safetensors except mHC/sinks/position_bias/router bias (f32) and "
                    "tid2eid (int64); run in fp32"),
    }
    present = {k.split("<")[0].rstrip("_") for k in meta if "<" in k}
    for fam in present:
        if not any(n.startswith(fam + "_") or n == fam for n in out):
            meta = {k: v for k, v in meta.items() if not k.startswith(fam + "_<")}
    save_file(out, path, metadata=meta)
    return out


def save_model(model, d):
    """bf16-class parameters to bf16 (exact: values were rounded at init), then HF's writer."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.is_floating_point() and not is_f32_param(name):
                p.data = p.data.to(torch.bfloat16)
    try:
        model.save_pretrained(d, safe_serialization=True)
    except TypeError:
        model.save_pretrained(d)


@torch.no_grad()
def reload_check(d, reqs, caps, device):
    from transformers import DeepseekV4ForCausalLM

    kw = dict(output_loading_info=True, attn_implementation="eager")
    try:
        m2, info = DeepseekV4ForCausalLM.from_pretrained(d, dtype=torch.float32, **kw)
    except TypeError:
        m2, info = DeepseekV4ForCausalLM.from_pretrained(d, torch_dtype=torch.float32, **kw)
    m2 = m2.to(device).eval()
    log("from_pretrained loading info:", {k: (list(v)[:8] if hasattr(v, "__iter__") else v)
                                          for k, v in info.items()})
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys",
                                         "error_msgs")), info
    for ids, cap in zip(reqs, caps):
        lg = m2(input_ids=ids[None].to(device), use_cache=False).logits[0].float().cpu()
        e = rel(lg, cap["logits"])
        log(f"reload round trip: logits rel err {e:.1e} (S={ids.numel()})")
        assert e <= 1e-5, "save_pretrained -> from_pretrained does not reproduce the logits"


def describe_saved(d):
    from safetensors import safe_open

    files = sorted(os.listdir(d))
    log(f"{d}: files " + ", ".join(f"{f} ({os.path.getsize(os.path.join(d, f))} B)" for f in files))
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        names = list(f.keys())
        log(f"model.safetensors: {len(names)} tensors; metadata {f.metadata()}")
        for n in sorted(names):
            try:
                s = f.get_slice(n)
                dt, shape = s.get_dtype(), s.get_shape()
            except Exception:  # noqa: BLE001
                t = f.get_tensor(n)
                dt, shape = t.dtype, list(t.shape)
            log(f"  {n} {dt} {shape}")


# --------------------------------------------------------------------------------------------


def make_fixture(name, fx, out_root, device):
    t0 = time.time()
    log(f"===== {name} =====")
    cfg = build_config(fx)
    torch.manual_seed(fx["seed"])
    model = build_model(cfg, device)
    reinit(model, cfg, fx["seed"])
    log(f"config.rope_parameters: {json.dumps(cfg.rope_parameters, sort_keys=True)}")
    for attempt in range(MAX_DRAWS):
        reqs = [draw_ids(fx["seed"], attempt, r, S, cfg.vocab_size) for r, S in enumerate(fx["lengths"])]
        caps = [run_hf(model, cfg, ids, device) for ids in reqs]
        gaps = {}
        for r, (ids, cap) in enumerate(zip(reqs, caps)):
            for k, v in tie_report(cap, cfg, ids.numel()).items():
                gaps[f"{k}_r{r}"] = v
        worst = min(gaps.values())
        log(f"draw {attempt}: smallest top-k margin {worst:.2e} "
            f"({min(gaps, key=gaps.get)})")
        if worst >= TIE_REL:
            break
    else:
        raise RuntimeError("could not draw inputs without near-ties")
    summaries = {}
    for r, (ids, cap) in enumerate(zip(reqs, caps)):
        pfx = f"[{name} r{r}]"
        check_shapes_and_sanity(cap, cfg, ids, pfx)
        check_attention_masks(cap, cfg, ids.numel(), pfx)
        summaries[f"r{r}"] = spec_check(model, cfg, ids, cap, pfx)
        chunked_check(model, ids, cap, device, pfx)
    d = os.path.join(out_root, name)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    save_reference(os.path.join(d, "reference.safetensors"), name, fx, cfg, model, reqs, caps,
                   fx["seed"], attempt, summaries, gaps, device)
    save_model(model.cpu(), d)
    describe_saved(d)
    reload_check(d, reqs, caps, device)
    total = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    log(f"{name}: {total / 1e6:.2f} MB written in {time.time() - t0:.1f}s")
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out-dir", default=os.path.join(here, "..", "..", "tests", "data"))
    ap.add_argument("--fixtures", default=",".join(FIXTURES))
    ap.add_argument("--device", default="cpu", help="cpu (default, preferred) or cuda")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--tar", default=None, help="also pack the fixture folders into this tar")
    ap.add_argument("--log", default=None, help="also write the log here")
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_default_dtype(torch.float32)
    import transformers

    log(f"python {platform.python_version()} torch {torch.__version__} transformers "
        f"{transformers.__version__} numpy {np.__version__} device {args.device}")
    t0 = time.time()
    try:
        probe_config_folding()
    except Exception as e:  # noqa: BLE001
        log(f"config folding probe failed: {e}")
    dirs = [make_fixture(n, FIXTURES[n], args.out_dir, args.device) for n in args.fixtures.split(",")]
    log(f"all fixtures done in {time.time() - t0:.1f}s")
    if args.tar:
        with tarfile.open(args.tar, "w") as tf:
            for d in dirs:
                tf.add(d, arcname=os.path.basename(d))
    if args.log:
        with open(args.log, "w") as f:
            f.write("\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()
