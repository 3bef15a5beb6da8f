#!/usr/bin/env python3
"""Re-check a committed fixture without transformers: read tests/data/<fixture>/config.json and
model.safetensors (the names save_pretrained wrote), map them to HF module names, run the
independent spec implementation (spec_forward.py) and compare with reference.safetensors.

Needs only numpy and torch (any version >= 1.13; no transformers, no safetensors package), so it
runs on a CPU machine. It proves that the committed checkpoint + config reproduce the golden
outputs under the name mapping below, which is the mapping the C++ loader must implement.

  python3 scripts/reference/check_fixture.py tests/data/dsv4_tiny_a [tests/data/dsv4_tiny_b ...]
"""

import json
import os
import re
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spec_forward  # noqa: E402

# saved name (regex on the part after "model.layers.N.") -> HF module name
LAYER_MAP = [
    (r"attn_norm\.weight", "input_layernorm.weight"),
    (r"ffn_norm\.weight", "post_attention_layernorm.weight"),
    (r"hc_attn_(fn|base|scale)", r"attn_hc.\1"),
    (r"hc_ffn_(fn|base|scale)", r"ffn_hc.\1"),
    (r"attn\.wq_a\.weight", "self_attn.q_a_proj.weight"),
    (r"attn\.q_norm\.weight", "self_attn.q_a_norm.weight"),
    (r"attn\.wq_b\.weight", "self_attn.q_b_proj.weight"),
    (r"attn\.wkv\.weight", "self_attn.kv_proj.weight"),
    (r"attn\.norm\.weight", "self_attn.kv_norm.weight"),  # the kv norm
    (r"attn\.wo_a\.weight", "self_attn.o_a_proj.weight"),
    (r"attn\.wo_b\.weight", "self_attn.o_b_proj.weight"),
    (r"attn\.attn_sink", "self_attn.sinks"),
    (r"attn\.compressor\.wkv\.weight", "self_attn.compressor.kv_proj.weight"),
    (r"attn\.compressor\.wgate\.weight", "self_attn.compressor.gate_proj.weight"),
    (r"attn\.compressor\.ape", "self_attn.compressor.position_bias"),
    (r"attn\.compressor\.norm\.weight", "self_attn.compressor.kv_norm.weight"),
    (r"attn\.indexer\.compressor\.wkv\.weight", "self_attn.compressor.indexer.kv_proj.weight"),
    (r"attn\.indexer\.compressor\.wgate\.weight", "self_attn.compressor.indexer.gate_proj.weight"),
    (r"attn\.indexer\.compressor\.ape", "self_attn.compressor.indexer.position_bias"),
    (r"attn\.indexer\.compressor\.norm\.weight", "self_attn.compressor.indexer.kv_norm.weight"),
    (r"attn\.indexer\.wq_b\.weight", "self_attn.compressor.indexer.q_b_proj.weight"),
    (r"attn\.indexer\.weights_proj\.weight", "self_attn.compressor.indexer.scorer.weights_proj.weight"),
    (r"ffn\.gate\.weight", "mlp.gate.weight"),
    (r"ffn\.gate\.bias", "mlp.gate.e_score_correction_bias"),
    (r"ffn\.gate\.tid2eid", "mlp.gate.tid2eid"),
    (r"ffn\.shared_experts\.w1\.weight", "mlp.shared_experts.gate_proj.weight"),
    (r"ffn\.shared_experts\.w3\.weight", "mlp.shared_experts.up_proj.weight"),
    (r"ffn\.shared_experts\.w2\.weight", "mlp.shared_experts.down_proj.weight"),
]
TOP_MAP = {"head.weight": "lm_head.weight"}  # everything else at top level keeps its name

DTYPES = {"F32": np.float32, "I64": np.int64, "BF16": np.uint16, "F16": np.float16}


def read_safetensors(path):
    """Minimal reader: returns ({name: torch tensor}, metadata)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=DTYPES[h["dtype"]]).reshape(h["shape"])
        if h["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = torch.from_numpy(arr.copy())
    return out, meta


def to_hf_names(saved):
    P, experts = {}, {}
    for name, t in saved.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.*)", name)
        if not m:
            P[TOP_MAP.get(name, name)] = t
            continue
        l, rest = m.groups()
        e = re.fullmatch(r"ffn\.experts\.(\d+)\.(w[123])\.weight", rest)
        if e:
            experts.setdefault(int(l), {})[(int(e.group(1)), e.group(2))] = t
            continue
        for pat, rep in LAYER_MAP:
            if re.fullmatch(pat, rest):
                P[f"model.layers.{l}." + re.sub(pat, rep, rest)] = t
                break
        else:
            raise KeyError(f"unmapped tensor {name}")
    for l, ws in experts.items():  # gate_up_proj[e] = [w1; w3] (gate rows first), down = w2
        n_exp = 1 + max(e for e, _ in ws)
        P[f"model.layers.{l}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([ws[(e, "w1")], ws[(e, "w3")]], 0) for e in range(n_exp)])
        P[f"model.layers.{l}.mlp.experts.down_proj"] = torch.stack([ws[(e, "w2")] for e in range(n_exp)])
    return P


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def check(d, tol=1e-4):
    cfg = json.load(open(os.path.join(d, "config.json")))
    P = to_hf_names(read_safetensors(os.path.join(d, "model.safetensors"))[0])
    ref, meta = read_safetensors(os.path.join(d, "reference.safetensors"))
    n_req = int(meta["n_requests"])
    L = cfg["num_hidden_layers"]
    ok = True
    for r in range(n_req):
        sfx = f"_{r}" if n_req > 1 else ""
        ids = ref["input_ids" + sfx]
        out = spec_forward.forward(P, cfg, ids, torch.float64)
        errs = [rel(out["streams"][i], ref[f"hidden_states_{i}{sfx}"]) for i in range(L)]
        errs.append(rel(out["final"], ref[f"hidden_states_{L}{sfx}"]))
        e_log = rel(out["logits"], ref["logits" + sfx])
        sets = 0
        for l, lt in enumerate(cfg["layer_types"]):
            if lt == "compressed_sparse_attention":
                a = out[f"indexer_topk_{l}"].sort(-1).values
                b = ref[f"indexer_topk_{l}{sfx}"].sort(-1).values
                sets += int((a != b).any(-1).sum())
            if f"router_indices_{l}{sfx}" in ref:
                a = out[f"router_indices_{l}"].sort(-1).values
                sets += int((a != ref[f"router_indices_{l}{sfx}"]).any(-1).sum())
        good = max(errs) < tol and e_log < tol and sets == 0
        ok &= good
        print(f"{os.path.basename(d)} request {r} (S={ids.numel()}): hidden_states rel err "
              + " ".join(f"{e:.1e}" for e in errs) + f"; logits {e_log:.1e}; rows with different "
              f"top-k sets {sets} -> {'OK' if good else 'FAIL'}")
    return ok


if __name__ == "__main__":
    dirs = sys.argv[1:] or sorted(
        os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", x)
        for x in os.listdir(os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data")))
    sys.exit(0 if all([check(d) for d in dirs]) else 1)
