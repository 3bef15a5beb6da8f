// Random checkpoint writer. Tensors are generated shard by shard (a plan of names, dtypes and
// shapes comes first, so only one shard is in memory at a time), in chunks of 64 Ki elements
// seeded from (seed, tensor name, chunk index), which makes the values independent of threads.
#include "io/random_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>
#include <random>

#include "core/host_memory.h"
#include "core/parallel.h"
#include "io/atomic_file.h"
#include "io/output_paths.h"
#include "io/quant.h"
#include "io/safetensors.h"
#include "io/tensor_names.h"

namespace cpfill {

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

constexpr int64_t kChunk = int64_t{1} << 16;

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t name_seed(uint64_t seed, std::string_view name) {
    uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
    for (char ch : name) h = (h ^ static_cast<uint8_t>(ch)) * 0x100000001B3ull;
    return splitmix64(seed ^ splitmix64(h));
}

uint64_t chunk_seed(uint64_t tensor_seed, int64_t chunk) {
    return splitmix64(tensor_seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(chunk + 1));
}

// x uniform in [0, n) without modulo bias (std::uniform_int_distribution is not portable).
uint64_t bounded(std::mt19937_64& rng, uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = rng();
    while (x >= limit);
    return x % n;
}

// out[i] = mean + stddev · N(0, 1), Box–Muller on pairs of 53-bit uniforms.
void fill_normal(float* out, int64_t n, uint64_t seed, double mean, double stddev,
                 ThreadPool& pool) {
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    pool.parallel_for(chunks, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
            std::mt19937_64 rng(chunk_seed(seed, c));
            const int64_t b = c * kChunk, e = std::min(n, b + kChunk);
            for (int64_t i = b; i < e; i += 2) {
                const double u1 = (static_cast<double>(rng() >> 11) + 0.5) * 0x1p-53;
                const double u2 = static_cast<double>(rng() >> 11) * 0x1p-53;
                const double r = std::sqrt(-2.0 * std::log(u1)), a = 2 * std::numbers::pi * u2;
                out[i] = static_cast<float>(mean + stddev * r * std::cos(a));
                if (i + 1 < e) out[i + 1] = static_cast<float>(mean + stddev * r * std::sin(a));
            }
        }
    });
}

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

Tensor random_weight_in(const ModelConfig& cfg, const WeightSpec& spec, uint64_t seed,
                        ThreadPool& pool) {
    const uint64_t ts = name_seed(seed, spec.name);
    if (spec.cls == WeightClass::I64) {  // tid2eid [vocab, top_k]: distinct experts per row
        const int64_t rows = spec.shape[0], k = spec.shape[1];
        Tensor t = Tensor::empty(DType::I64, spec.shape);
        int64_t* ids = t.data<int64_t>();
        const int64_t rows_per_chunk = std::max<int64_t>(1, kChunk / std::max<int64_t>(k, 1));
        const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
        pool.parallel_for(chunks, [&](int64_t c0, int64_t c1) {
            for (int64_t c = c0; c < c1; ++c) {
                std::mt19937_64 rng(chunk_seed(ts, c));
                const int64_t r1 = std::min(rows, (c + 1) * rows_per_chunk);
                for (int64_t r = c * rows_per_chunk; r < r1; ++r)
                    for (int64_t j = 0; j < k; ++j) {
                        int64_t e;
                        bool dup;
                        do {
                            e = static_cast<int64_t>(bounded(rng, cfg.n_experts));
                            dup = std::find(ids + r * k, ids + r * k + j, e) != ids + r * k + j;
                        } while (dup);
                        ids[r * k + j] = e;
                    }
            }
        });
        return t;
    }
    Tensor t = Tensor::empty(DType::F32, spec.shape);
    const double mean = spec.init.mean, stddev = spec.init.std;  // the weight table's
    fill_normal(t.f32(), t.numel(), ts, mean, stddev, pool);
    return t;
}

// Storage of one weight in the file.
enum class Store { F32, BF16, Fp8, Fp4, I64 };

Store store_of(WeightClass cls, const RandomCheckpointOptions& o) {
    if (cls == WeightClass::I64) return Store::I64;
    if (cls == WeightClass::Fp4Expert && o.experts == "fp4") return Store::Fp4;
    if (o.dtype == "f32") return Store::F32;
    if (cls == WeightClass::F32) return Store::F32;
    if (o.dtype == "bf16" || cls == WeightClass::BF16) return Store::BF16;
    return Store::Fp8;  // Fp8Linear, and Fp4Expert with experts == "same"
}

struct Out {
    std::string name;
    DType dtype;
    Shape shape;
};

// Stored tensors of a logical [rows, cols] (or N-D) weight.
std::vector<Out> outputs(const std::string& name, const std::string& scale, const Shape& s,
                         Store st) {
    auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
    switch (st) {
        case Store::F32:
            return {{name, DType::F32, s}};
        case Store::BF16:
            return {{name, DType::BF16, s}};
        case Store::I64:
            return {{name, DType::I64, s}};
        case Store::Fp8:
            return {{name, DType::F8_E4M3, s},
                    {scale, DType::F8_E8M0, {cdiv(s[0], 128), cdiv(s[1], 128)}}};
        case Store::Fp4:
            return {{name, DType::I8, {s[0], s[1] / 2}},
                    {scale, DType::F8_E8M0, {s[0], cdiv(s[1], 32)}}};
    }
    return {};
}

std::vector<Tensor> encode(const Tensor& w, Store st) {
    switch (st) {
        case Store::F32:
        case Store::I64:
            return {w};
        case Store::BF16:
            return {f32_to_bf16_tensor(w)};
        case Store::Fp8: {
            QuantizedWeight q = quantize_fp8_block128(w);
            return {q.weight, q.scale};
        }
        case Store::Fp4: {
            QuantizedWeight q = quantize_fp4_block32(w);
            return {q.weight, q.scale};
        }
    }
    return {};
}

// One unit of the shard plan: the stored tensors it writes and how to make them.
struct Item {
    std::vector<Out> outs;
    std::function<std::vector<Tensor>()> make;
    size_t bytes() const {
        size_t n = 0;
        for (const Out& o : outs)
            n += static_cast<size_t>(shape_numel(o.shape)) * dtype_size(o.dtype);
        return n;
    }
};

Shape prepend(int64_t n, Shape s) {
    s.insert(s.begin(), n);
    return s;
}

// hf-module routed experts of one layer: gate_up_proj [E, 2I, D] = per expert [w1; w3], and
// down_proj [E, D, I]; each expert's slab is encoded on its own (block scales per expert).
Item stacked_item(const ModelConfig& cfg, const WeightSpecTable& table, int layer, bool gate_up,
                  Store st, uint64_t seed, ThreadPool& pool) {
    const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
    const std::string name = p + (gate_up ? "gate_up_proj" : "down_proj");
    const Shape slab =
        gate_up ? Shape{2 * int64_t{cfg.moe_dim}, cfg.d_model} : Shape{cfg.d_model, cfg.moe_dim};
    Item it;
    for (Out o : outputs(name, scale_name(name, Naming::HfModule), slab, st)) {
        o.shape = prepend(cfg.n_experts, o.shape);
        it.outs.push_back(o);
    }
    it.make = [&cfg, &table, &pool, layer, gate_up, st, seed, outs = it.outs] {
        std::vector<Tensor> stacked;
        for (const Out& o : outs) stacked.push_back(Tensor::empty(o.dtype, o.shape));
        const std::string x = "layers." + std::to_string(layer) + ".ffn.experts.";
        for (int e = 0; e < cfg.n_experts; ++e) {
            const std::string pe = x + std::to_string(e) + ".";
            Tensor w;
            if (gate_up) {
                Tensor w1 = random_weight_in(cfg, table.at(pe + "w1.weight"), seed, pool);
                Tensor w3 = random_weight_in(cfg, table.at(pe + "w3.weight"), seed, pool);
                w = Tensor::empty(DType::F32, {2 * w1.dim(0), w1.dim(1)});
                std::memcpy(w.f32(), w1.f32(), w1.nbytes());
                std::memcpy(w.f32() + w1.numel(), w3.f32(), w3.nbytes());
            } else {
                w = random_weight_in(cfg, table.at(pe + "w2.weight"), seed, pool);
            }
            std::vector<Tensor> enc = encode(w, st);
            for (size_t k = 0; k < enc.size(); ++k)
                std::memcpy(static_cast<std::byte*>(stacked[k].raw_mut()) + e * enc[k].nbytes(),
                            enc[k].raw(), enc[k].nbytes());
        }
        return stacked;
    };
    return it;
}

std::vector<Item> plan_items(const ModelConfig& cfg, const WeightSpecTable& table, Naming naming,
                             const RandomCheckpointOptions& o, ThreadPool& pool) {
    std::vector<Item> items;
    for (const WeightSpec& spec : table.all()) {
        const Store st = store_of(spec.cls, o);
        if (naming == Naming::HfModule && spec.expert >= 0) {
            if (spec.expert == 0 && ends_with(spec.name, "w1.weight")) {
                items.push_back(stacked_item(cfg, table, spec.layer, true, st, o.seed, pool));
                items.push_back(stacked_item(cfg, table, spec.layer, false, st, o.seed, pool));
            }
            continue;
        }
        const std::string name = stored_name(spec.name, naming).name;
        Item it;
        it.outs = outputs(name, scale_name(name, naming), spec.shape, st);
        it.make = [&cfg, &pool, spec_ptr = &spec, st, seed = o.seed] {
            return encode(random_weight_in(cfg, *spec_ptr, seed, pool), st);
        };
        items.push_back(std::move(it));
    }
    return items;
}

std::string config_json(const ModelConfig& cfg, const RandomCheckpointOptions& o) {
    const bool upstream = o.names == "upstream";
    ojson j = ojson::parse(model_config_to_json(cfg, upstream ? "upstream" : "hf"));
    if (upstream) {  // ModelArgs' storage keys
        j["dtype"] = o.dtype == "fp8" ? "fp8" : "bf16";
        j["scale_fmt"] = "ue8m0";
        j["expert_dtype"] = o.experts == "fp4" ? ojson("fp4") : ojson(nullptr);
        j["scale_dtype"] = "fp8";
        return j.dump(2) + "\n";
    }
    j["dtype"] = o.dtype == "f32" ? "float32" : "bfloat16";
    if (o.dtype == "fp8")
        j["quantization_config"] = {{"quant_method", "fp8"},
                                    {"fmt", "e4m3"},
                                    {"scale_fmt", "ue8m0"},
                                    {"activation_scheme", "dynamic"},
                                    {"weight_block_size", {128, 128}}};
    if (o.experts == "fp4") j["expert_dtype"] = "fp4";
    return j.dump(2) + "\n";
}

void write_text(const fs::path& path, const std::string& text) {
    write_file_atomically(path.string(), text);
}

// Weight files of an earlier run would be mixed into the new checkpoint by the loader.
void remove_old_weights(const fs::path& dir) {
    for (const auto& entry : fs::directory_iterator(dir)) {
        const std::string n = entry.path().filename().string();
        const bool shard = n.rfind("model-", 0) == 0 && ends_with(n, ".safetensors");
        if (shard || n == "model.safetensors" || n == "model.safetensors.index.json")
            fs::remove(entry.path());
    }
}

// A config whose tensor list alone would not fit into memory (millions of experts or layers).
void check_tensor_count(const ModelConfig& cfg) {
    const double tensors =
        static_cast<double>(cfg.n_layers) * (3.0 * static_cast<double>(cfg.n_experts) + 64.0);
    CPFILL_CHECK(tensors <= 1e7,
                 "config: {} layers of {} routed experts make about {:.3g} tensors, expected at "
                 "most 10 million (V4-Pro has 47 thousand)",
                 cfg.n_layers, cfg.n_experts, tensors);
}

// Every tensor's element count and fp32 bytes must be representable (overflow-checked): an
// impossible shape is named here instead of ending in std::bad_alloc halfway.
void check_sizes(const ModelConfig& cfg, const WeightSpecTable& table) {
    (void)cfg;
    for (const WeightSpec& spec : table.all()) {
        int64_t n = 1;
        bool ok = true;
        for (int64_t d : spec.shape) ok = ok && d >= 0 && !__builtin_mul_overflow(n, d, &n);
        ok = ok && n <= (int64_t{1} << 56);  // 256 PiB of fp32
        CPFILL_CHECK(ok, "config: tensor {} would have shape {}: too large to generate", spec.name,
                     shape_str(spec.shape));
    }
}

// One file of the checkpoint: its items and stored bytes.
struct Shard {
    std::vector<const Item*> items;
    size_t bytes = 0;      // stored bytes (data only)
    size_t work = 0;       // the largest item's fp32 temporaries while it is made
    size_t n_tensors = 0;  // stored tensors
    std::string largest;   // the item with the largest fp32 temporaries
    std::string file;
};

// fp32 values of an item before encoding (a stacked item makes one expert's at a time).
size_t work_bytes(const Item& it) {
    size_t f32 = 0;
    for (const Out& o : it.outs) {
        if (o.dtype == DType::F8_E8M0) continue;  // scales
        int64_t n = shape_numel(o.shape);
        if (o.dtype == DType::I8) n *= 2;  // packed fp4: two values a byte
        f32 = std::max(f32, static_cast<size_t>(n) * 4);
    }
    return 2 * f32;  // the values and a conversion's copy
}

std::vector<Shard> plan_shards(const std::vector<Item>& items, size_t max_shard_bytes) {
    std::vector<Shard> shards(1);
    for (const Item& it : items) {
        if (shards.back().bytes > 0 && shards.back().bytes + it.bytes() > max_shard_bytes)
            shards.emplace_back();
        Shard& sh = shards.back();
        sh.items.push_back(&it);
        sh.bytes += it.bytes();
        if (work_bytes(it) > sh.work) sh.work = work_bytes(it), sh.largest = it.outs[0].name;
        sh.n_tensors += it.outs.size();
    }
    for (size_t i = 0; i < shards.size(); ++i)
        shards[i].file = shards.size() == 1 ? std::string("model.safetensors")
                                            : fmt::format("model-{:05d}-of-{:05d}.safetensors",
                                                          i + 1, shards.size());
    return shards;
}

fs::path target_path(const std::string& dir) {
    CPFILL_CHECK(!dir.empty(), "--out: expected a folder name");
    fs::path root = fs::path(dir).lexically_normal();
    if (root.filename().empty()) root = root.parent_path();  // "m/" → "m"
    return root;
}

// The target can be made, the largest shard (with the fp32 values of its largest tensor) fits into
// host memory, and the files fit on the disk and under the file size limit.
void check_target(const fs::path& root, const std::vector<Shard>& shards, size_t max_shard_bytes) {
    check_output_folder(root.string(), "--out");
    const Shard* heaviest = &shards[0];
    std::vector<PlannedOutput> files;
    files.push_back({"--out config.json", (root / "config.json").string(), size_t{1} << 16});
    for (const Shard& sh : shards) {
        if (sh.bytes + sh.work > heaviest->bytes + heaviest->work) heaviest = &sh;
        files.push_back({fmt::format("--out {}", sh.file), (root / sh.file).string(),
                         sh.bytes + 4096 + 256 * sh.n_tensors});
    }
    if (shards.size() > 1)
        files.push_back({"--out model.safetensors.index.json",
                         (root / "model.safetensors.index.json").string(),
                         4096 + 256 * static_cast<size_t>(shards.size()) * 64});
    const size_t memory = heaviest->bytes + heaviest->work;
    if (const auto have = host_memory_available())
        CPFILL_CHECK(memory <= have->available,
                     "out of host memory: generating {} needs {:.2f} GB ({:.2f} GB of stored "
                     "tensors, at most max_shard_bytes {} unless one tensor is larger, and {:.2f} "
                     "GB of fp32 values of {}) but {:.2f} GB are available ({})",
                     heaviest->file, memory * 1e-9, heaviest->bytes * 1e-9, max_shard_bytes,
                     heaviest->work * 1e-9, heaviest->largest, have->available * 1e-9,
                     have->source);
    check_output_space(files);
}

// The folder the checkpoint is written into before it is moved into place: beside the target
// when the target does not exist (then renamed to it), else inside it (then its files are moved
// up, replacing the earlier checkpoint's only once the new one is complete). Same filesystem
// either way, so every move is a rename. Removed with its contents unless committed.
struct Staging {
    fs::path root, path;
    bool into_existing = false;

    explicit Staging(const fs::path& target) : root(target) {
        std::error_code ec;
        into_existing = fs::is_directory(root, ec);
        const std::string tag = fmt::format(".gen-model-tmp-{}", ::getpid());
        if (into_existing) {
            path = root / tag;
        } else {
            const fs::path parent = root.has_parent_path() ? root.parent_path() : fs::path(".");
            fs::create_directories(parent, ec);
            CPFILL_CHECK(!ec, "--out {}: cannot create the folder {} ({})", root.string(),
                         parent.string(), ec.message());
            path = parent / fmt::format(".{}{}", root.filename().string(), tag);
        }
        fs::remove_all(path, ec);
        fs::create_directory(path, ec);
        CPFILL_CHECK(!ec, "--out {}: cannot create the folder {} ({})", root.string(),
                     path.string(), ec.message());
    }
    ~Staging() {
        std::error_code ec;
        if (!path.empty()) fs::remove_all(path, ec);
    }
    Staging(const Staging&) = delete;
    Staging& operator=(const Staging&) = delete;

    void commit() {
        std::error_code ec;
        if (!into_existing) {
            fs::rename(path, root, ec);
            CPFILL_CHECK(!ec, "--out {}: moving the finished checkpoint into place failed ({})",
                         root.string(), ec.message());
            path.clear();
            return;
        }
        // Weight files of an earlier run would be mixed into the new checkpoint by the loader.
        remove_old_weights(root);
        for (const auto& e : fs::directory_iterator(path)) {
            fs::rename(e.path(), root / e.path().filename(), ec);
            CPFILL_CHECK(!ec, "--out {}: moving {} into place failed ({})", root.string(),
                         e.path().filename().string(), ec.message());
        }
    }
};

}  // namespace

Tensor random_weight(const ModelConfig& cfg, const WeightSpec& spec, uint64_t seed, int threads) {
    ThreadPool pool(threads);
    return random_weight_in(cfg, spec, seed, pool);
}

void write_random_checkpoint(const ModelConfig& cfg, const std::string& dir,
                             const RandomCheckpointOptions& o) {
    validate_model_config(cfg, "write_random_checkpoint");
    Naming naming = Naming::HfSaved;
    if (o.names == "upstream")
        naming = Naming::Upstream;
    else if (o.names == "hf-module")
        naming = Naming::HfModule;
    else
        CPFILL_CHECK(o.names == "hf", "names \"{}\": expected hf, upstream or hf-module", o.names);
    CPFILL_CHECK(o.dtype == "f32" || o.dtype == "bf16" || o.dtype == "fp8",
                 "dtype \"{}\": expected f32, bf16 or fp8", o.dtype);
    CPFILL_CHECK(o.experts == "same" || o.experts == "fp4", "experts \"{}\": expected same or fp4",
                 o.experts);
    CPFILL_CHECK(o.max_shard_bytes > 0, "max_shard_bytes must be positive");
    check_tensor_count(cfg);

    // Everything is planned and checked before anything is written: sizes, memory, disk.
    ThreadPool pool(o.threads > 0 ? o.threads : default_thread_count());
    const WeightSpecTable table(cfg);
    check_sizes(cfg, table);
    std::vector<Item> items = plan_items(cfg, table, naming, o, pool);
    const std::vector<Shard> shards = plan_shards(items, o.max_shard_bytes);
    const fs::path root = target_path(dir);
    check_target(root, shards, o.max_shard_bytes);

    // Written into a staging folder and moved into place when complete (see the header).
    Staging staging(root);
    write_text(staging.path / "config.json", config_json(cfg, o));
    size_t total = 0, done = 0;
    for (const Shard& sh : shards) total += sh.bytes;
    ojson weight_map = ojson::object();
    for (const Shard& sh : shards) {
        std::vector<std::pair<std::string, Tensor>> tensors;
        for (const Item* it : sh.items) {
            std::vector<Tensor> made = it->make();
            for (size_t k = 0; k < made.size(); ++k) {
                const Out& out = it->outs[k];
                CPFILL_CHECK(made[k].dtype() == out.dtype && made[k].shape() == out.shape,
                             "internal: {} made as {} {}, planned {} {}", out.name, made[k].dtype(),
                             shape_str(made[k].shape()), out.dtype, shape_str(out.shape));
                tensors.emplace_back(out.name, std::move(made[k]));
                weight_map[out.name] = sh.file;
            }
            done += it->bytes();
            if (o.on_progress) o.on_progress(done, total);
        }
        write_safetensors((staging.path / sh.file).string(), tensors, {{"format", "pt"}});
    }
    if (shards.size() > 1)
        write_text(
            staging.path / "model.safetensors.index.json",
            ojson{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) +
                "\n");
    staging.commit();
}

}  // namespace cpfill
