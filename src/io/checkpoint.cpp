// Checkpoint: name resolution (tensor_names), format detection from the stored dtype, shape
// checks against the weight table (weight_specs) and dequantisation (quant). Stored tensors stay
// mmapped; only the rows asked for are converted.
#include "io/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "io/quant.h"

namespace cpfill {

namespace {

constexpr int64_t kFp8Block = 128;
constexpr int64_t kFp4Block = 32;

enum class Format { Float, Fp8, Fp4, Int };

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::optional<Format> format_of(DType t) {
    switch (t) {
        case DType::F32:
        case DType::BF16:
        case DType::F16:
            return Format::Float;
        case DType::F8_E4M3:
            return Format::Fp8;
        case DType::I8:
        case DType::U8:
            return Format::Fp4;
        case DType::I64:
        case DType::I32:
            return Format::Int;
        default:
            return std::nullopt;
    }
}

const char* format_desc(Format f) {
    switch (f) {
        case Format::Float:
            return "float";
        case Format::Fp8:
            return "fp8 e4m3 with 128x128 E8M0 block scales";
        case Format::Fp4:
            return "packed fp4 e2m1 (two per byte) with 1x32 E8M0 scales";
        case Format::Int:
            return "integer";
    }
    return "?";
}

// Rows [r0, r1) of dimension 0 of `t`, zero-copy (keeps `t`'s storage alive).
Tensor rows_view(const Tensor& t, int64_t r0, int64_t r1) {
    Shape s = t.shape();
    const size_t row_bytes = s[0] > 0 ? t.nbytes() / static_cast<size_t>(s[0]) : 0;
    s[0] = r1 - r0;
    auto keep = std::make_shared<Tensor>(t);
    const auto* base = static_cast<const std::byte*>(keep->raw());
    return Tensor::borrow(t.dtype(), std::move(s), base + static_cast<size_t>(r0) * row_bytes,
                          std::shared_ptr<const void>(keep, keep->raw()));
}

// Slice [e] of a stacked [E, ...] tensor, as a tensor of the remaining dimensions.
Tensor expert_view(const Tensor& t, int e) {
    Shape inner(t.shape().begin() + 1, t.shape().end());
    return rows_view(t, e, e + 1).reshaped(inner);
}

// Block scales as E8M0: F8_E8M0 as is; F32 (HF keeps scale_inv in fp32) if every value is a
// power of two.
Tensor scale_as_e8m0(const Tensor& s, const std::string& name) {
    if (s.dtype() == DType::F8_E8M0) return s;
    CPFILL_CHECK(s.dtype() == DType::F32,
                 "block scale {}: expected dtype F8_E8M0 (or F32), found {}", name, s.dtype());
    Tensor out = Tensor::empty(DType::F8_E8M0, s.shape());
    const float* src = s.f32();
    uint8_t* dst = out.data<uint8_t>();
    for (int64_t i = 0; i < s.numel(); ++i) {
        int exp = 0;
        const float m = std::frexp(src[i], &exp);  // src = m · 2^exp, m in [0.5, 1)
        CPFILL_CHECK(m == 0.5f && exp - 1 >= -127 && exp - 1 <= 127,
                     "block scale {}: element {} is {}, expected a power of two", name, i, src[i]);
        dst[i] = static_cast<uint8_t>(exp - 1 + 127);
    }
    return out;
}

}  // namespace

// A canonical weight resolved to stored tensors. `slab` = the 2-D (or N-D for float) logical
// region inside the stored tensor: the whole tensor, or expert e of a stacked one; `row_off`
// skips the w1 half of gate_up_proj for w3.
struct Checkpoint::Located {
    Format fmt = Format::Float;
    std::string name, scale;
    const TensorInfo* info = nullptr;
    int expert = -1;
    StackPart part = StackPart::Whole;
    int64_t row_off = 0;
};

Checkpoint::Checkpoint(const std::string& dir)
    : dir_(dir),
      cfg_(load_model_config((std::filesystem::path(dir) / "config.json").string())),
      specs_(cfg_),
      files_(std::make_unique<SafetensorsSet>(dir)) {
    const std::vector<std::string> names = files_->names();
    auto n = detect_naming(names);
    CPFILL_CHECK(n.has_value(),
                 "{}: cannot tell the tensor naming: expected embed.weight / layers.* (upstream) "
                 "or model.* (HF), found {} tensors{}{}",
                 dir, names.size(), names.empty() ? "" : ", the first named ",
                 names.empty() ? "" : names.front());
    naming_ = *n;
}

Checkpoint::Located Checkpoint::locate(const WeightSpec& spec) const {
    StoredName sn = stored_name(spec.name, naming_);
    std::vector<std::string> tried{sn.name};
    tried.insert(tried.end(), sn.alternates.begin(), sn.alternates.end());
    Located loc;
    for (const std::string& t : tried)
        if (files_->has(t)) {
            loc.name = t;
            break;
        }
    if (loc.name.empty() && spec.name == "head.weight" && cfg_.tie_word_embeddings)
        return locate(specs_.at("embed.weight"));
    CPFILL_CHECK(!loc.name.empty(),
                 "{}: tensor {} is missing: looked for \"{}\" ({} naming, {} tensors in the "
                 "checkpoint)",
                 dir_, spec.name, fmt::join(tried, "\" or \""), naming(), files_->names().size());
    loc.info = &files_->info(loc.name);
    loc.expert = sn.expert;
    loc.part = sn.part;
    const TensorInfo& info = *loc.info;
    const std::string where =
        fmt::format("{}: tensor {} (stored as \"{}\" in {})", dir_, spec.name, loc.name, info.file);
    auto fmt_opt = format_of(info.dtype);
    CPFILL_CHECK(fmt_opt.has_value(), "{}: unsupported dtype {}", where, info.dtype);
    loc.fmt = *fmt_opt;
    const bool want_int = spec.cls == WeightClass::I64;
    CPFILL_CHECK(want_int == (loc.fmt == Format::Int), "{}: expected {}, found dtype {}", where,
                 want_int ? "an integer dtype (I64 or I32)" : "a float or quantised dtype",
                 info.dtype);

    // Logical shape of the slab, then its stored shape and the scale's.
    Shape slab = spec.shape;
    if (loc.part != StackPart::Whole) {
        slab[0] *= 2;
        loc.row_off = loc.part == StackPart::SecondHalf ? spec.shape[0] : 0;
    }
    Shape stored = slab, scale;
    if (loc.fmt == Format::Fp8 || loc.fmt == Format::Fp4) {
        CPFILL_CHECK(slab.size() == 2, "{}: found dtype {} but a {}-D weight cannot be quantised",
                     where, info.dtype, slab.size());
        if (loc.fmt == Format::Fp8) {
            scale = {ceil_div(slab[0], kFp8Block), ceil_div(slab[1], kFp8Block)};
        } else {
            CPFILL_CHECK(slab[1] % 2 == 0, "{}: packed fp4 needs an even column count, found {}",
                         where, shape_str(slab));
            stored[1] = slab[1] / 2;
            scale = {slab[0], ceil_div(slab[1], kFp4Block)};
        }
    }
    if (loc.expert >= 0) {
        stored.insert(stored.begin(), cfg_.n_experts);
        if (!scale.empty()) scale.insert(scale.begin(), cfg_.n_experts);
    }
    CPFILL_CHECK(info.shape == stored, "{}: expected shape {} for {} ({}), found {}", where,
                 shape_str(stored), info.dtype, format_desc(loc.fmt), shape_str(info.shape));
    if (scale.empty()) return loc;

    std::vector<std::string> cands = scale_names(loc.name, naming_);
    for (const std::string& c : cands)
        if (files_->has(c)) {
            loc.scale = c;
            break;
        }
    CPFILL_CHECK(!loc.scale.empty(), "{}: dtype {} needs a block scale: looked for \"{}\"", where,
                 info.dtype, fmt::join(cands, "\" or \""));
    const TensorInfo& si = files_->info(loc.scale);
    CPFILL_CHECK(si.dtype == DType::F8_E8M0 || si.dtype == DType::F32,
                 "{}: block scale \"{}\": expected dtype F8_E8M0, found {}", where, loc.scale,
                 si.dtype);
    CPFILL_CHECK(si.shape == scale, "{}: block scale \"{}\": expected shape {}, found {}", where,
                 loc.scale, shape_str(scale), shape_str(si.shape));
    return loc;
}

Tensor Checkpoint::read_rows(const WeightSpec& spec, const Located& loc, int64_t r0,
                             int64_t r1) const {
    Tensor w = files_->get(loc.name);
    if (loc.expert >= 0) w = expert_view(w, loc.expert);
    const int64_t a = loc.row_off + r0, b = loc.row_off + r1;  // rows inside the slab
    Shape out_shape = spec.shape;
    out_shape[0] = r1 - r0;
    if (loc.fmt == Format::Float) return to_f32(rows_view(w, a, b)).reshaped(out_shape);

    Tensor s = scale_as_e8m0(files_->get(loc.scale), loc.scale);
    if (loc.expert >= 0) s = expert_view(s, loc.expert);
    if (loc.fmt == Format::Fp4)
        return dequantize_fp4_block32(rows_view(w, a, b), rows_view(s, a, b));
    // fp8: dequantise the 128-row tiles covering [a, b), then keep the rows asked for.
    const int64_t t0 = a / kFp8Block, t1 = ceil_div(b, kFp8Block);
    const int64_t w0 = t0 * kFp8Block, w1 = std::min(w.dim(0), t1 * kFp8Block);
    Tensor tiles = dequantize_fp8_block128(rows_view(w, w0, w1), rows_view(s, t0, t1));
    if (w0 == a && w1 == b) return tiles;
    Tensor out = Tensor::empty(DType::F32, out_shape);
    const int64_t cols = tiles.dim(1);
    std::memcpy(out.f32(), tiles.f32() + (a - w0) * cols, out.nbytes());
    return out;
}

bool Checkpoint::has(const std::string& canonical) const {
    const WeightSpec* spec = specs_.find(canonical);
    if (!spec) return false;
    StoredName sn = stored_name(canonical, naming_);
    if (files_->has(sn.name)) return true;
    for (const std::string& alt : sn.alternates)
        if (files_->has(alt)) return true;
    return canonical == "head.weight" && cfg_.tie_word_embeddings && has("embed.weight");
}

StoredWeight Checkpoint::stored(const std::string& canonical) const {
    const WeightSpec& spec = specs_.at(canonical);
    Located loc = locate(spec);
    StoredWeight s{loc.name, loc.scale, loc.info->dtype, loc.info->shape, loc.expert, loc.part, 0};
    size_t bytes = loc.info->end - loc.info->begin;
    if (!loc.scale.empty()) {
        const TensorInfo& si = files_->info(loc.scale);
        bytes += si.end - si.begin;
    }
    if (loc.expert >= 0) bytes /= static_cast<size_t>(cfg_.n_experts);
    if (loc.part != StackPart::Whole) bytes /= 2;
    s.bytes = bytes;
    return s;
}

Tensor Checkpoint::get_f32(const std::string& canonical) const {
    const WeightSpec& spec = specs_.at(canonical);
    CPFILL_CHECK(spec.cls != WeightClass::I64, "tensor {} holds integers: use get_i64", canonical);
    return read_rows(spec, locate(spec), 0, spec.shape[0]);
}

Tensor Checkpoint::get_f32_rows(const std::string& canonical, int64_t row_begin,
                                int64_t row_end) const {
    const WeightSpec& spec = specs_.at(canonical);
    CPFILL_CHECK(spec.cls != WeightClass::I64, "tensor {} holds integers: use get_i64", canonical);
    CPFILL_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= spec.shape[0],
                 "tensor {}: rows [{}, {}) out of range for shape {}", canonical, row_begin,
                 row_end, shape_str(spec.shape));
    return read_rows(spec, locate(spec), row_begin, row_end);
}

Tensor Checkpoint::get_i64(const std::string& canonical) const {
    const WeightSpec& spec = specs_.at(canonical);
    CPFILL_CHECK(spec.cls == WeightClass::I64, "tensor {} is not an integer table: use get_f32",
                 canonical);
    Located loc = locate(spec);
    const Tensor t = files_->get(loc.name);  // I64 or I32 [vocab, top_k]
    Tensor out = Tensor::empty(DType::I64, spec.shape);
    int64_t* dst = out.data<int64_t>();
    for (int64_t i = 0; i < out.numel(); ++i) {
        const int64_t v = t.dtype() == DType::I64 ? t.data<int64_t>()[i] : t.data<int32_t>()[i];
        CPFILL_CHECK(v >= 0 && v < cfg_.n_experts,
                     "{}: tensor {} (\"{}\"): element {} is {}, expected an expert id in [0, {})",
                     dir_, canonical, loc.name, i, v, cfg_.n_experts);
        dst[i] = v;
    }
    return out;
}

void Checkpoint::validate() const {
    for (const WeightSpec& spec : specs_.all()) locate(spec);
}

std::vector<std::string> Checkpoint::unused_tensors() const {
    std::set<std::string> used;
    for (const WeightSpec& spec : specs_.all()) {
        if (!has(spec.name)) continue;
        Located loc = locate(spec);
        used.insert(loc.name);
        if (!loc.scale.empty()) used.insert(loc.scale);
    }
    std::vector<std::string> out;
    for (const std::string& n : files_->names())
        if (!used.count(n)) out.push_back(n);
    return out;
}

}  // namespace cpfill
