// Checkpoint: name resolution (tensor_names), format detection from the stored dtype, shape
// checks against the weight table (weight_specs) and dequantisation of any rectangle of a weight
// (read_block). Stored tensors stay mmapped; only the blocks covering the rectangle are touched.
// The element conversions are those of core/dtype (through lookup tables holding exactly their
// values), so every rectangle has the same bits as the matching part of the whole weight
// dequantised by io/quant.
#include "io/checkpoint.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <tuple>

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

// Element values of e4m3, e2m1 and e8m0 codes: exactly core/dtype's conversions, tabulated.
struct CodeTables {
    float e4m3[256], e8m0[256], e2m1[16];
    CodeTables() {
        for (int v = 0; v < 256; ++v) {
            e4m3[v] = e4m3_to_f32(static_cast<uint8_t>(v));
            e8m0[v] = e8m0_to_f32(static_cast<uint8_t>(v));
        }
        for (int v = 0; v < 16; ++v) e2m1[v] = e2m1_to_f32(static_cast<uint8_t>(v));
    }
};
const CodeTables& code_tables() {
    static const CodeTables t;
    return t;
}

// A stored 2-D slab [rows, cols] (logical columns; fp4 packs two per byte) and its block scales.
struct Slab {
    Format fmt = Format::Float;
    DType dtype = DType::F32;
    const uint8_t* w = nullptr;  // row 0 of the slab
    int64_t cols = 0;
    int64_t row_bytes = 0;       // stored bytes of a row
    const uint8_t* s = nullptr;  // scale [.., scols]: E8M0 bytes, or F32 powers of two (HF)
    DType sdtype = DType::F8_E8M0;
    int64_t scols = 0;
    const std::string* scale_name = nullptr;

    // Scale i as a float: E8M0 through the table; an F32 scale must be a power of two 2^k,
    // k in [-127, 127] (what converting it to E8M0 would keep exactly).
    float scale(int64_t i) const {
        if (sdtype == DType::F8_E8M0) return code_tables().e8m0[s[i]];
        float v;
        std::memcpy(&v, s + 4 * i, 4);
        int exp = 0;
        const float m = std::frexp(v, &exp);  // v = m · 2^exp, m in [0.5, 1)
        CPFILL_CHECK(m == 0.5f && exp - 1 >= -127 && exp - 1 <= 127,
                     "block scale {}: element {} is {}, expected a power of two", *scale_name, i,
                     v);
        return v;
    }
};

// Rows [r0, r1) × columns [c0, c1) of a float slab into dst (c1 - c0 per row).
void read_float(const Slab& sl, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float* dst) {
    const int64_t n = c1 - c0;
    const size_t esize = dtype_size(sl.dtype);
    for (int64_t r = r0; r < r1; ++r, dst += n) {
        const uint8_t* src = sl.w + (r * sl.cols + c0) * static_cast<int64_t>(esize);
        if (sl.dtype == DType::F32) {
            std::memcpy(dst, src, static_cast<size_t>(n) * 4);
        } else if (sl.dtype == DType::BF16) {
            for (int64_t c = 0; c < n; ++c) {
                uint16_t v;
                std::memcpy(&v, src + 2 * c, 2);
                dst[c] = std::bit_cast<float>(static_cast<uint32_t>(v) << 16);  // = bf16_to_f32
            }
        } else {
            for (int64_t c = 0; c < n; ++c) {
                uint16_t v;
                std::memcpy(&v, src + 2 * c, 2);
                dst[c] = f16_to_f32(v);
            }
        }
    }
}

// fp8: W[r, c] = e4m3(q[r, c]) · scale[r / 128, c / 128]; one scale per row and 128-column tile.
void read_fp8(const Slab& sl, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float* dst) {
    const float* lut = code_tables().e4m3;
    for (int64_t r = r0; r < r1; ++r, dst += c1 - c0) {
        const uint8_t* q = sl.w + r * sl.cols;
        const int64_t srow = (r / kFp8Block) * sl.scols;
        for (int64_t c = c0; c < c1;) {
            const int64_t tile = c / kFp8Block, end = std::min(c1, (tile + 1) * kFp8Block);
            const float sc = sl.scale(srow + tile);
            for (; c < end; ++c) dst[c - c0] = lut[q[c]] * sc;
        }
    }
}

// fp4: W[r, c] = e2m1(nibble c of row r; element 2j low, 2j+1 high) · scale[r, c / 32].
// Blocks start at even columns, so inside a block whole bytes are decoded, two elements each.
void read_fp4(const Slab& sl, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float* dst) {
    const float* lut = code_tables().e2m1;
    for (int64_t r = r0; r < r1; ++r, dst += c1 - c0) {
        const uint8_t* q = sl.w + r * (sl.cols / 2);
        float* out = dst - c0;  // out[c] is element c of the row
        const int64_t srow = r * sl.scols;
        for (int64_t c = c0; c < c1;) {
            const int64_t block = c / kFp4Block, end = std::min(c1, (block + 1) * kFp4Block);
            const float sc = sl.scale(srow + block);
            if (c & 1) out[c] = lut[q[c >> 1] >> 4] * sc, ++c;  // a rectangle's odd first column
            for (; c + 1 < end; c += 2) {
                const uint8_t byte = q[c >> 1];
                out[c] = lut[byte & 0xf] * sc;
                out[c + 1] = lut[byte >> 4] * sc;
            }
            if (c < end) out[c] = lut[q[c >> 1] & 0xf] * sc, ++c;  // an odd last column
        }
    }
}

// Advice on a range of a mapping (page-aligned outward). MADV_WILLNEED starts reading it from disk
// in large requests and returns; MADV_POPULATE_READ (Linux 5.14+) maps it all in one call instead
// of a page fault per 16 pages. Advice only: failures (older kernels) change nothing.
void advise(const uint8_t* p, size_t n, int advice) {
    if (n == 0) return;
    const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t b = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
    ::madvise(reinterpret_cast<void*>(b), reinterpret_cast<uintptr_t>(p) + n - b, advice);
}

// A weight seen as 2-D: [shape[0], product of the other dimensions] (1-D: one column).
std::pair<int64_t, int64_t> dims_2d(const Shape& shape) {
    int64_t cols = 1;
    for (size_t i = 1; i < shape.size(); ++i) cols *= shape[i];
    return {shape.empty() ? 1 : shape[0], cols};
}

// The stored slab [rows, cols] of weight `w` (expert `expert` of a stacked one, or -1) and its
// scales `s` (undefined when not block-quantised).
Slab make_slab(Format fmt, int64_t cols, const Tensor& w, const Tensor& s, int expert,
               const std::string& scale_name) {
    Slab sl;
    sl.fmt = fmt;
    sl.dtype = w.dtype();
    sl.cols = cols;
    sl.w = static_cast<const uint8_t*>(w.raw());
    if (expert >= 0) sl.w += w.nbytes() / static_cast<size_t>(w.dim(0)) * expert;
    sl.row_bytes =
        fmt == Format::Fp4 ? cols / 2 : cols * static_cast<int64_t>(dtype_size(w.dtype()));
    if (s.raw()) {
        sl.s = static_cast<const uint8_t*>(s.raw());
        if (expert >= 0) sl.s += s.nbytes() / static_cast<size_t>(s.dim(0)) * expert;
        sl.sdtype = s.dtype();
        sl.scols = s.dim(s.ndim() - 1);
        sl.scale_name = &scale_name;
    }
    return sl;
}

// Names the weight, where it is stored and the index (in the weight's own shape; a weight of more
// than two dimensions is read as [shape[0], rest]) of a non-finite element.
[[noreturn]] void fail_non_finite(const std::string& dir, const WeightSpec& spec,
                                  const std::string& stored, const TensorInfo& info, int64_t row,
                                  int64_t col, float value) {
    std::vector<int64_t> index(std::max<size_t>(spec.shape.size(), 1), 0);
    index[0] = row;
    int64_t rest = col;
    for (size_t d = spec.shape.size(); d-- > 1;) {
        index[d] = rest % spec.shape[d];
        rest /= spec.shape[d];
    }
    CPFILL_FAIL(
        "{}: tensor {} (stored as \"{}\" in {}, {}): element [{}] is {}, expected a finite "
        "value (the first non-finite element read: the file is corrupt or was written from "
        "overflowed values)",
        dir, spec.name, stored, info.file, info.dtype, fmt::join(index, ", "), value);
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

void Checkpoint::read_block(const WeightSpec& spec, const Located& loc, int64_t r0, int64_t r1,
                            int64_t c0, int64_t c1, float* dst) const {
    if (r0 == r1 || c0 == c1) return;
    const Tensor w = files_->get(loc.name);  // views of the mapping (stacked: [E, ...])
    const Tensor s = loc.scale.empty() ? Tensor() : files_->get(loc.scale);
    const Slab sl = make_slab(loc.fmt, dims_2d(spec.shape).second, w, s, loc.expert, loc.scale);
    // Rows inside the slab: the w3 half of a stacked gate_up_proj starts at row_off.
    const int64_t a = loc.row_off + r0, b = loc.row_off + r1;
#ifdef MADV_POPULATE_READ
    advise(sl.w + a * sl.row_bytes, static_cast<size_t>((b - a) * sl.row_bytes),
           MADV_POPULATE_READ);
#endif
    void (*read)(const Slab&, int64_t, int64_t, int64_t, int64_t, float*) = nullptr;
    switch (loc.fmt) {
        case Format::Float:
            read = read_float;
            break;
        case Format::Fp8:
            read = read_fp8;
            break;
        case Format::Fp4:
            read = read_fp4;
            break;
        case Format::Int:
            CPFILL_FAIL("tensor {} holds integers: use get_i64", spec.name);
    }
    // Row by row, so that the finiteness check reads each row while it is still in cache. A NaN
    // or Inf weight (a corrupt file, an overflowed conversion, an fp8 NaN code, an E8M0 0xff scale)
    // would otherwise turn every logit into NaN without a word.
    const int64_t n = c1 - c0;
    for (int64_t r = a; r < b; ++r, dst += n) {
        read(sl, r, r + 1, c0, c1, dst);
        for (int64_t c = 0; c < n; ++c)
            if (!std::isfinite(dst[c])) [[unlikely]]
                fail_non_finite(dir_, spec, loc.name, *loc.info, r - loc.row_off, c0 + c, dst[c]);
    }
}

void Checkpoint::prefetch(const std::string& canonical, int64_t r0, int64_t r1) const {
    const WeightSpec& spec = specs_.at(canonical);
    const Located loc = locate(spec);
    if (loc.fmt == Format::Int || r0 >= r1) return;
    const Tensor w = files_->get(loc.name);
    const Tensor s = loc.scale.empty() ? Tensor() : files_->get(loc.scale);
    const Slab sl = make_slab(loc.fmt, dims_2d(spec.shape).second, w, s, loc.expert, loc.scale);
    const int64_t a = loc.row_off + r0, b = loc.row_off + r1;
    advise(sl.w + a * sl.row_bytes, static_cast<size_t>((b - a) * sl.row_bytes), MADV_WILLNEED);
    if (!sl.s) return;
    // Scale rows: one per row (fp4) or per 128 rows (fp8).
    const int64_t per = loc.fmt == Format::Fp8 ? kFp8Block : 1;
    const int64_t s0 = a / per, s1 = ceil_div(b, per);
    const int64_t srow_bytes = sl.scols * static_cast<int64_t>(dtype_size(sl.sdtype));
    advise(sl.s + s0 * srow_bytes, static_cast<size_t>((s1 - s0) * srow_bytes), MADV_WILLNEED);
}

void Checkpoint::read_f32_block(const std::string& canonical, int64_t r0, int64_t r1, int64_t c0,
                                int64_t c1, float* dst) const {
    const WeightSpec& spec = specs_.at(canonical);
    CPFILL_CHECK(spec.cls != WeightClass::I64, "tensor {} holds integers: use get_i64", canonical);
    const auto [rows, cols] = dims_2d(spec.shape);
    CPFILL_CHECK(0 <= r0 && r0 <= r1 && r1 <= rows && 0 <= c0 && c0 <= c1 && c1 <= cols,
                 "tensor {}: block rows [{}, {}) x columns [{}, {}) out of range for shape {} "
                 "(seen as [{}, {}])",
                 canonical, r0, r1, c0, c1, shape_str(spec.shape), rows, cols);
    read_block(spec, locate(spec), r0, r1, c0, c1, dst);
}

StoredSlab Checkpoint::slab(const std::string& canonical) const {
    const WeightSpec& spec = specs_.at(canonical);
    const Located loc = locate(spec);
    CPFILL_CHECK(loc.fmt != Format::Int, "tensor {} holds integers: use get_i64", canonical);
    StoredSlab out;
    out.w_view = files_->get(loc.name);
    if (!loc.scale.empty()) out.s_view = files_->get(loc.scale);
    const Slab sl = make_slab(loc.fmt, dims_2d(spec.shape).second, out.w_view, out.s_view,
                              loc.expert, loc.scale);
    out.kind = loc.fmt == Format::Fp8   ? StoredSlab::Kind::Fp8
               : loc.fmt == Format::Fp4 ? StoredSlab::Kind::Fp4
                                        : StoredSlab::Kind::Float;
    out.dtype = sl.dtype;
    std::tie(out.rows, out.cols) = dims_2d(spec.shape);
    out.row_bytes = sl.row_bytes;
    out.w = sl.w + loc.row_off * sl.row_bytes;
    if (sl.s) {
        out.s = sl.s;
        out.sdtype = sl.sdtype;
        out.s_cols = sl.scols;
        out.s_row_off = loc.row_off;
        out.row_block = loc.fmt == Format::Fp8 ? kFp8Block : 1;
        out.col_block = loc.fmt == Format::Fp8 ? kFp8Block : kFp4Block;
    }
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
    const auto [rows, cols] = dims_2d(spec.shape);
    Tensor out = Tensor::empty(DType::F32, spec.shape);
    read_f32_block(canonical, 0, rows, 0, cols, out.f32());
    return out;
}

Tensor Checkpoint::get_f32_rows(const std::string& canonical, int64_t row_begin,
                                int64_t row_end) const {
    const WeightSpec& spec = specs_.at(canonical);
    const auto [rows, cols] = dims_2d(spec.shape);
    CPFILL_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= rows,
                 "tensor {}: rows [{}, {}) out of range for shape {}", canonical, row_begin,
                 row_end, shape_str(spec.shape));
    Shape shape = spec.shape;
    shape[0] = row_end - row_begin;
    Tensor out = Tensor::empty(DType::F32, shape);
    read_f32_block(canonical, row_begin, row_end, 0, cols, out.f32());
    return out;
}

Tensor Checkpoint::get_f32_cols(const std::string& canonical, int64_t col_begin,
                                int64_t col_end) const {
    const WeightSpec& spec = specs_.at(canonical);
    CPFILL_CHECK(spec.shape.size() == 2, "tensor {}: column slices need a 2-D weight, found {}",
                 canonical, shape_str(spec.shape));
    CPFILL_CHECK(0 <= col_begin && col_begin <= col_end && col_end <= spec.shape[1],
                 "tensor {}: columns [{}, {}) out of range for shape {}", canonical, col_begin,
                 col_end, shape_str(spec.shape));
    Tensor out = Tensor::empty(DType::F32, {spec.shape[0], col_end - col_begin});
    read_f32_block(canonical, 0, spec.shape[0], col_begin, col_end, out.f32());
    return out;
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
