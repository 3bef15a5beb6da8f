// The order of a decoder block's ops and its exchanges (decoder_block.h).
#include "model/decoder_block.h"

namespace cpfill {

void moe_finish(BlockOps& b, int s, int layer, bool then_collapse) {
    b.wait(Exchange::MoeSums, s, layer);
    if (then_collapse)
        b.residual_collapse(s, layer, Site::Ffn, layer + 1, Site::Attn);
    else
        b.residual(s, layer, Site::Ffn);
    b.layer_done(s, layer);
}

void attention_stage(BlockOps& b, int s, int layer) {
    if (layer > 0)
        moe_finish(b, s, layer - 1, true);
    else
        b.collapse(s, layer, Site::Attn);
    b.attn_pack(s, layer);
    b.start(Exchange::AttnInputs, s, layer);
    b.attn_queries(s, layer);  // under the gather of the attention inputs
    b.wait(Exchange::AttnInputs, s, layer);
    b.kv_append(s, layer);
    b.attn_output(s, layer);
    b.residual_collapse(s, layer, Site::Attn, layer, Site::Ffn);
    b.start(Exchange::MoeInputs, s, layer);
    b.moe_route(s, layer);
}

void moe_stage(BlockOps& b, int s, int layer) {
    b.wait(Exchange::MoeInputs, s, layer);
    b.moe_experts(s, layer);
    b.start(Exchange::MoeSums, s, layer);
}

}  // namespace cpfill
