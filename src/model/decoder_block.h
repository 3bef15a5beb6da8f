// The decoder block of one layer, defined once for both backends (docs/architecture.md §3;
// docs/parallel.md, "One engine"): mHC collapse → RMSNorm → attention → mHC residual update →
// mHC collapse → RMSNorm → MoE → mHC residual update. A backend supplies the ops (BlockOps); this
// file fixes their order and the points where a block needs rows other ranks hold (Exchange), and
// cuts the block there into the two stages that two-batch overlap alternates between sub-batches
// (parallel/engine.h).
//
// Ops name a sub-batch by its index s (0 or 1) in the chunk being run and a layer by its index; the
// backend keeps the sub-batch's state (residual, layouts, buffers) itself.
#pragma once

namespace cpfill {

// The two mHC sites of a layer: before attention and before the MoE.
enum class Site { Attn, Ffn };

// Where the block needs other ranks' rows (context parallelism deals tokens round-robin):
// * AttnInputs: the packed attention inputs (key, compressor and indexer projections) of every
//   row, for the KV store: an all-gather;
// * MoeInputs:  the MoE input of every row (fused TP-MoE: each rank runs all rows through its
//   slice of every expert): an all-gather;
// * MoeSums:    each rank's partial MoE sums of every row, summed back to the row's rank: a
//   reduce-scatter.
// parallel/exchange_plan.h says how each is carried out (collective, width per row).
enum class Exchange { AttnInputs, MoeInputs, MoeSums, kCount };

class BlockOps {
  public:
    virtual ~BlockOps() = default;

    // mHC pre-mix of the residual at (layer, site), its collapse and the site's RMSNorm: the
    // attention input (Attn) or the MoE input in MoeInputs' send buffer (Ffn).
    virtual void collapse(int s, int layer, Site site) = 0;
    // mHC post-mix: the residual updated with the site's sub-block output (the attention output;
    // the summed MoE output from MoeSums' receive buffer).
    virtual void residual(int s, int layer, Site site) = 0;
    // residual(layer, from) then collapse(next_layer, to): a backend may fuse the two (one pass
    // over the residual instead of three).
    virtual void residual_collapse(int s, int layer, Site from, int next_layer, Site to) {
        residual(s, layer, from);
        collapse(s, next_layer, to);
    }
    // Attention: the packed inputs of the local rows into AttnInputs' send buffer; the queries
    // (and the indexer's) of the local rows; the gathered rows appended to the KV store; the
    // attention output of the local rows.
    virtual void attn_pack(int s, int layer) = 0;
    virtual void attn_queries(int s, int layer) = 0;
    virtual void kv_append(int s, int layer) = 0;
    virtual void attn_output(int s, int layer) = 0;
    // MoE: routing may start (the MoE input of every row is on its way or here); the experts of
    // this rank over every row into MoeSums' send buffer.
    virtual void moe_route(int /*s*/, int /*layer*/) {}
    virtual void moe_experts(int s, int layer) = 0;
    // An exchange's send buffer is complete: start it. The block needs its result: wait for it.
    virtual void start(Exchange e, int s, int layer) = 0;
    virtual void wait(Exchange e, int s, int layer) = 0;
    // The residual of sub-batch s after `layer` is final (records of hidden states).
    virtual void layer_done(int /*s*/, int /*layer*/) {}
};

// The block cut at its exchanges into the two stages two-batch overlap alternates:
// attention_stage: [the previous layer's MoE finished] → attention → MoE inputs started;
void attention_stage(BlockOps& b, int s, int layer);
// moe_stage: MoE inputs waited for → experts → MoE sums started;
void moe_stage(BlockOps& b, int s, int layer);
// moe_finish: MoE sums waited for → residual update; with `then_collapse` fused with the next
// layer's attention collapse (attention_stage does this for layers after the first).
void moe_finish(BlockOps& b, int s, int layer, bool then_collapse);

}  // namespace cpfill
