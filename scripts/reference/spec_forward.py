"""Independent re-implementation of the DeepSeek-V4 prefill forward, written from the
specification (docs/architecture.md §3), not from Hugging Face's code.

generate.py runs it (in float64 and float32) next to HF transformers on the same weights and
reports, layer by layer, how far HF is from it. That checks two things at once: that the spec
the C++ engine is written from describes what HF computes, and how large plain fp32 rounding
differences are (the tolerance a correct fp32 engine can expect against the golden files).

Only torch is needed (no transformers): parameters come in as a dict keyed by HF *module*
names (`model.layers.3.self_attn.q_a_proj.weight`, ...), the config as a plain dict.
"""

import math

import torch
import torch.nn.functional as F

ROPE_DIM = 64  # trailing rotary channels of every head (main q/kv, compressed kv, indexer)


def rms(x, eps):
    """Unweighted RMSNorm over the last dim."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def inv_freq_plain(theta, dim=ROPE_DIM):
    j = torch.arange(dim // 2, dtype=torch.float64)
    return theta ** (-2.0 * j / dim)


def inv_freq_yarn(theta, factor, orig_max, beta_fast, beta_slow, dim=ROPE_DIM):
    """§3.0: YaRN ramp between the original and the /factor frequency, no mscale."""
    f = inv_freq_plain(theta, dim)
    low = math.floor(dim * math.log(orig_max / (beta_fast * 2 * math.pi)) / (2 * math.log(theta)))
    high = math.ceil(dim * math.log(orig_max / (beta_slow * 2 * math.pi)) / (2 * math.log(theta)))
    low, high = max(low, 0), min(high, dim - 1)
    j = torch.arange(dim // 2, dtype=torch.float64)
    ramp = ((j - low) / (high - low)).clamp(0, 1)
    return f * (1 - ramp) + (f / factor) * ramp


def rope(x, pos, inv):
    """Interleaved RoPE on the trailing 2*len(inv) channels; x [..., n, C], pos [n]."""
    r = 2 * inv.numel()
    ang = pos.to(inv.dtype)[:, None] * inv[None, :]  # [n, r/2]
    c, s = torch.cos(ang), torch.sin(ang)
    a, b = x[..., -r::2], x[..., -r + 1 :: 2]
    out = x.clone()
    out[..., -r::2] = a * c - b * s
    out[..., -r + 1 :: 2] = b * c + a * s
    return out


def mhc(h, fn, base, scale, iters, eps_hc, eps):
    """§3.3: one mHC site. h [S, N, D] -> post [S, N], comb [S, N, N], collapsed x [S, D]."""
    S, N, _ = h.shape
    u = rms(h.reshape(S, -1), eps)
    z = u @ fn.T
    pre = torch.sigmoid(scale[0] * z[:, :N] + base[:N]) + eps_hc
    post = 2 * torch.sigmoid(scale[1] * z[:, N : 2 * N] + base[N : 2 * N])
    logits = (scale[2] * z[:, 2 * N :] + base[2 * N :]).view(S, N, N)
    c = torch.softmax(logits, dim=-1) + eps_hc
    c = c / (c.sum(-2, keepdim=True) + eps_hc)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps_hc)
        c = c / (c.sum(-2, keepdim=True) + eps_hc)
    x = (pre[:, :, None] * h).sum(1)
    return post, c, x


def expand(h, post, comb, out):
    """h_new[t,k] = post[t,k]*out[t] + sum_j comb[t,j,k]*h[t,j]."""
    return post[:, :, None] * out[:, None, :] + torch.einsum("tjk,tjd->tkd", comb, h)


def pool(x, w_kv, w_gate, bias, norm_w, ratio, d, overlap, inv, eps):
    """§3.5-3.7: compressed entries [T, d] (T = S // ratio)."""
    S = x.shape[0]
    T = S // ratio
    if T == 0:
        return x.new_zeros(0, d)
    c = (x @ w_kv.T)[: T * ratio].view(T, ratio, -1)
    z = (x @ w_gate.T)[: T * ratio].view(T, ratio, -1) + bias[None]
    if overlap:  # CSA: slots = Ca of window w-1 (first d channels), Cb of window w (last d)
        kv = x.new_zeros(T, 2 * ratio, d)
        g = x.new_full((T, 2 * ratio, d), float("-inf"))
        kv[:, ratio:], g[:, ratio:] = c[..., d:], z[..., d:]
        kv[1:, :ratio], g[1:, :ratio] = c[:-1, :, :d], z[:-1, :, :d]
    else:
        kv, g = c, z
    pooled = (torch.softmax(g, dim=1) * kv).sum(1)
    entry = norm_w * rms(pooled, eps)
    return rope(entry, torch.arange(T) * ratio, inv)


def indexer(P, pre, x, cq, cfg, inv, eps):
    """§3.7 lightning indexer: returns (mask [S, T] bool of selected entries, scores [S, T],
    keys [T, dI], topk-with-minus-one [S, k])."""
    S = x.shape[0]
    ratio, nI, dI, kI = 4, cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_topk"]
    p = pre + "compressor.indexer."
    keys = pool(x, P[p + "kv_proj.weight"], P[p + "gate_proj.weight"], P[p + "position_bias"],
                P[p + "kv_norm.weight"], ratio, dI, True, inv, eps)
    T = keys.shape[0]
    q = (cq @ P[p + "q_b_proj.weight"].T).view(S, nI, dI).transpose(0, 1)  # [nI, S, dI]
    q = rope(q, torch.arange(S), inv)
    w = (x @ P[p + "scorer.weights_proj.weight"].T) * nI**-0.5  # [S, nI]
    dots = torch.relu(torch.einsum("hsd,td->hst", q, keys))
    scores = dI**-0.5 * torch.einsum("sh,hst->st", w, dots)
    t = torch.arange(S)
    eligible = torch.arange(T)[None, :] < ((t + 1) // ratio)[:, None]
    k = min(kI, T)
    top = scores.masked_fill(~eligible, float("-inf")).topk(k, dim=-1).indices
    valid = eligible.gather(1, top)
    top = torch.where(valid, top, torch.full_like(top, -1))
    mask = torch.zeros(S, T + 1, dtype=torch.bool)
    mask.scatter_(1, torch.where(valid, top, torch.full_like(top, T)), True)
    return mask[:, :T], scores, keys, top


def attention(P, l, layer_type, x, cfg, inv, eps, rec):
    """§3.4: x [S, D] (already normed) -> [S, D]."""
    S = x.shape[0]
    H, d, g, ro = cfg["num_attention_heads"], cfg["head_dim"], cfg["o_groups"], cfg["o_lora_rank"]
    W = cfg["sliding_window"]
    p = f"model.layers.{l}.self_attn."
    pos = torch.arange(S)
    cq = P[p + "q_a_norm.weight"] * rms(x @ P[p + "q_a_proj.weight"].T, eps)
    q = rms((cq @ P[p + "q_b_proj.weight"].T).view(S, H, d), eps).transpose(0, 1)  # [H, S, d]
    q = rope(q, pos, inv)
    kv = rope(P[p + "kv_norm.weight"] * rms(x @ P[p + "kv_proj.weight"].T, eps), pos, inv)
    t = pos[:, None]
    allowed = (t - pos[None, :] >= 0) & (t - pos[None, :] < W)  # [S, S]
    keys = kv
    if layer_type != "sliding_attention":
        csa = layer_type == "compressed_sparse_attention"
        ratio = cfg["compress_rates"][layer_type]
        entries = pool(x, P[p + "compressor.kv_proj.weight"], P[p + "compressor.gate_proj.weight"],
                       P[p + "compressor.position_bias"], P[p + "compressor.kv_norm.weight"],
                       ratio, d, csa, inv, eps)
        T = entries.shape[0]
        if csa:
            sel, scores, ikeys, top = indexer(P, p, x, cq, cfg, inv, eps)
            rec[f"indexer_topk_{l}"], rec[f"indexer_scores_{l}"] = top, scores
            rec[f"indexer_keys_{l}"] = ikeys
        else:
            sel = torch.arange(T)[None, :] < ((pos + 1) // ratio)[:, None]
        rec[f"compressed_kv_{l}"] = entries
        keys = torch.cat([kv, entries], 0)
        allowed = torch.cat([allowed, sel], 1)
    logits = torch.einsum("hsd,kd->hsk", q, keys) * d**-0.5
    logits = logits.masked_fill(~allowed[None], float("-inf"))
    sink = P[p + "sinks"][:, None]  # [H, 1]
    m = torch.maximum(logits.max(-1).values, sink)  # [H, S]
    num = torch.exp(logits - m[..., None])
    prob = num / (num.sum(-1) + torch.exp(sink - m))[..., None]
    rec[f"attn_probs_{l}"] = prob  # [H, S, S+T] probabilities without the sink column
    o = torch.einsum("hsk,kd->hsd", prob, keys)
    o = rope(o, pos, -inv).transpose(0, 1).reshape(S, g, H * d // g)  # de-rotate, group heads
    wa = P[p + "o_a_proj.weight"].view(g, ro, H * d // g)
    y = torch.einsum("sgi,gri->sgr", o, wa).reshape(S, g * ro)
    return y @ P[p + "o_b_proj.weight"].T


def swiglu(y, w1, w3, w2, limit):
    a = (y @ w1.T).clamp(max=limit)
    u = (y @ w3.T).clamp(min=-limit, max=limit)
    return (F.silu(a) * u) @ w2.T


def moe(P, l, is_hash, y, ids, cfg, rec):
    """§3.8. y [S, D] (already normed)."""
    p = f"model.layers.{l}.mlp."
    k, I, lim = cfg["num_experts_per_tok"], cfg["moe_intermediate_size"], cfg["swiglu_limit"]
    s = torch.sqrt(F.softplus(y @ P[p + "gate.weight"].T))
    if is_hash:
        idx = P[p + "gate.tid2eid"][ids].long()
    else:
        idx = (s + P[p + "gate.e_score_correction_bias"]).topk(k, dim=-1).indices
    wts = s.gather(1, idx)
    wts = wts / wts.sum(-1, keepdim=True) * cfg["routed_scaling_factor"]
    rec[f"router_indices_{l}"], rec[f"router_weights_{l}"] = idx, wts
    gu, down = P[p + "experts.gate_up_proj"], P[p + "experts.down_proj"]
    out = torch.zeros_like(y)
    for e in range(gu.shape[0]):
        rows, slot = torch.nonzero(idx == e, as_tuple=True)
        if rows.numel():
            h = swiglu(y[rows], gu[e, :I], gu[e, I:], down[e], lim)
            out.index_add_(0, rows, wts[rows, slot, None] * h)
    sp = p + "shared_experts."
    return out + swiglu(y, P[sp + "gate_proj.weight"], P[sp + "up_proj.weight"],
                        P[sp + "down_proj.weight"], lim)


def forward(P, cfg, ids, dtype=torch.float64):
    """Whole prefill of one request. P: {HF module name: tensor}; cfg: config dict.
    Returns {"streams": [h after embedding, after each layer...], "final": [S, D], "logits",
    plus per-layer records (indexer_topk_l, router_indices_l, compressed_kv_l, ...)}."""
    P = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in P.items()}
    eps, eps_hc, iters = cfg["rms_norm_eps"], cfg["hc_eps"], cfg["hc_sinkhorn_iters"]
    rc = cfg["rope_parameters"]["compress"]
    inv = {
        "main": inv_freq_plain(cfg["rope_theta"]).to(dtype),
        "compress": inv_freq_yarn(cfg["compress_rope_theta"], rc["factor"],
                                  rc["original_max_position_embeddings"], rc["beta_fast"],
                                  rc["beta_slow"]).to(dtype),
    }
    N = cfg["hc_mult"]
    e = P["model.embed_tokens.weight"][ids]
    h = e[:, None, :].repeat(1, N, 1)
    rec = {"streams": [h]}
    for l, lt in enumerate(cfg["layer_types"]):
        p = f"model.layers.{l}."
        table = inv["main"] if lt == "sliding_attention" else inv["compress"]
        post, comb, x = mhc(h, P[p + "attn_hc.fn"], P[p + "attn_hc.base"], P[p + "attn_hc.scale"],
                            iters, eps_hc, eps)
        a = attention(P, l, lt, P[p + "input_layernorm.weight"] * rms(x, eps), cfg, table, eps, rec)
        h = expand(h, post, comb, a)
        post, comb, x = mhc(h, P[p + "ffn_hc.fn"], P[p + "ffn_hc.base"], P[p + "ffn_hc.scale"],
                            iters, eps_hc, eps)
        f = moe(P, l, cfg["mlp_layer_types"][l] == "hash_moe",
                P[p + "post_attention_layernorm.weight"] * rms(x, eps), ids, cfg, rec)
        h = expand(h, post, comb, f)
        rec["streams"].append(h)
    S = h.shape[0]
    u = rms(h.reshape(S, -1), eps)
    pre = torch.sigmoid(P["model.hc_head.hc_scale"] * (u @ P["model.hc_head.hc_fn"].T)
                        + P["model.hc_head.hc_base"]) + eps_hc
    z = P["model.norm.weight"] * rms((pre[:, :, None] * h).sum(1), eps)
    rec["final"] = z
    rec["logits"] = z @ P["lm_head.weight"].T
    rec["inv_freq"] = inv
    return rec
