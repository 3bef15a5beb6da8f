// SafetensorsFile, parse_safetensors_header and write_safetensors: round trips, and one test per
// malformation, each checking that the error names the file, the tensor and expected vs found.
#include <cstring>

#include "io/safetensors.h"
#include "io_test_util.h"

namespace cpfill {
namespace {

using test::expect_error;
using test::safetensors_bytes;
using test::TempDir;
using test::write_file;

Tensor iota_f32(Shape shape, float start) {
    Tensor t = Tensor::empty(DType::F32, std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = start + static_cast<float>(i);
    return t;
}

Tensor bytes_tensor(DType dtype, Shape shape, uint8_t seed) {
    Tensor t = Tensor::empty(dtype, std::move(shape));
    auto* p = static_cast<uint8_t*>(t.raw_mut());
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(seed + 31 * i);
    return t;
}

void expect_same(const Tensor& a, const Tensor& b, const std::string& name) {
    EXPECT_EQ(a.dtype(), b.dtype()) << name;
    EXPECT_EQ(a.shape(), b.shape()) << name;
    ASSERT_EQ(a.nbytes(), b.nbytes()) << name;
    if (a.nbytes() > 0) {
        EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << name;
    }
}

// One well-formed F32 [2, 2] tensor "a" at [0, 16].
const std::string kValidHeader =
    R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"__metadata__":{"format":"pt"}})";

TEST(SafetensorsFile, RoundTripKeepsBytesShapesAndMetadata) {
    TempDir dir;
    const std::string path = dir.file("t.safetensors");
    // An odd-sized fp8 tensor first leaves the F32 after it misaligned in the data area.
    const std::vector<std::pair<std::string, Tensor>> tensors = {
        {"w.fp8", bytes_tensor(DType::F8_E4M3, {3, 3}, 1)},
        {"x.f32", iota_f32({2, 3}, -2.0f)},
        {"y.bf16", bytes_tensor(DType::BF16, {5}, 7)},
        {"ids", bytes_tensor(DType::I64, {2}, 9)},
        {"scalar", iota_f32({}, 42.0f)},
        {"empty", Tensor::empty(DType::F32, {0, 4})},
    };
    write_safetensors(path, tensors, {{"format", "pt"}, {"note", "hello"}});

    SafetensorsFile f(path);
    EXPECT_EQ(f.path(), path);
    EXPECT_EQ(f.tensors().size(), tensors.size());
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.metadata().at("note"), "hello");
    for (const auto& [name, t] : tensors) {
        ASSERT_TRUE(f.has(name)) << name;
        expect_same(f.get(name), t, name);
        EXPECT_EQ(f.tensors().at(name).file, path);
    }
    const Tensor x = f.get("x.f32");  // at offset 9: copied so that its floats are aligned
    EXPECT_EQ(reinterpret_cast<uintptr_t>(x.raw()) % 4, 0u);
    EXPECT_EQ(x.f32()[5], 3.0f);
    EXPECT_EQ(static_cast<const Tensor&>(f.get("scalar")).f32()[0], 42.0f);
    // Data contiguous in the given order; first tensor at 0.
    EXPECT_EQ(f.tensors().at("w.fp8").begin, 0u);
    EXPECT_EQ(f.tensors().at("x.f32").begin, 9u);
    EXPECT_EQ(f.tensors().at("x.f32").end, 33u);
}

TEST(SafetensorsFile, WriterAlignsTheDataAreaTo8Bytes) {
    TempDir dir;
    const std::string path = dir.file("t.safetensors");
    write_safetensors(path, {{"a", iota_f32({3}, 0.0f)}});
    std::ifstream in(path, std::ios::binary);
    unsigned char len[8];
    in.read(reinterpret_cast<char*>(len), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
    EXPECT_EQ((8 + n) % 8, 0u);
    EXPECT_EQ(std::filesystem::file_size(path), 8 + n + 12);
}

TEST(SafetensorsFile, ReadsAHandWrittenFile) {
    TempDir dir;
    const std::string path = dir.file("t.safetensors");
    float v[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    write_file(path, safetensors_bytes(kValidHeader, std::string(reinterpret_cast<char*>(v), 16)));
    SafetensorsFile f(path);
    const Tensor a = f.get("a");
    EXPECT_EQ(a.shape(), (Shape{2, 2}));
    EXPECT_EQ(a.f32()[3], 4.0f);
    Tensor b = f.get("a");  // writing to a view must never reach the (read-only) mapping
    b.f32()[0] = 9.0f;
    EXPECT_EQ(static_cast<const Tensor&>(f.get("a")).f32()[0], 1.0f);
}

TEST(SafetensorsFile, GetOfAnAbsentTensorNamesIt) {
    TempDir dir;
    const std::string path = dir.file("t.safetensors");
    write_safetensors(path, {{"a", iota_f32({1}, 0.0f)}});
    SafetensorsFile f(path);
    EXPECT_FALSE(f.has("b"));
    expect_error([&] { f.get("b"); }, {path, "'b'"});
}

TEST(SafetensorsFile, MissingFile) {
    TempDir dir;
    expect_error([&] { SafetensorsFile f(dir.file("none.safetensors")); }, {"none.safetensors"});
}

TEST(SafetensorsFile, TruncatedFileShorterThanTheLength) {
    TempDir dir;
    const std::string path = dir.file("t.safetensors");
    write_file(path, std::string("\x05\x00\x00", 3));
    expect_error([&] { SafetensorsFile f(path); }, {path, "truncated", "3 bytes", "at least 8"});
}

TEST(SafetensorsFile, TruncatedDataArea) {
    TempDir dir;
    const std::string path = dir.file("t.safetensors");
    write_file(path, safetensors_bytes(kValidHeader, std::string(10, '\0')));  // 16 needed
    expect_error([&] { SafetensorsFile f(path); }, {path, "'a'", "[0, 16]", "10 bytes"});
}

TEST(SafetensorsFile, HeaderLengthBeyondFile) {
    TempDir dir;
    const std::string path = dir.file("t.safetensors");
    write_file(path, safetensors_bytes(kValidHeader, std::string(16, '\0'), 1000));
    const uint64_t size = 8 + kValidHeader.size() + 16;
    expect_error([&] { SafetensorsFile f(path); },
                 {path, "header length 1000", fmt::format("at most {}", size - 8)});
    // A length near 2^64 must not wrap around.
    write_file(path, safetensors_bytes(kValidHeader, "", ~uint64_t{0}));
    expect_error([&] { SafetensorsFile f(path); }, {path, "header length"});
}

TEST(SafetensorsFile, OffsetsOutsideTheDataArea) {
    TempDir dir;
    const std::string path = dir.file("t.safetensors");
    const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})";
    write_file(path, safetensors_bytes(header, std::string(16, '\0')));
    expect_error([&] { SafetensorsFile f(path); },
                 {path, "'a'", "[16, 24]", "outside the data area of 16 bytes"});
}

TEST(SafetensorsFile, SizeMismatch) {
    TempDir dir;
    const std::string path = dir.file("t.safetensors");
    const std::string header = R"({"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,16]}})";
    write_file(path, safetensors_bytes(header, std::string(16, '\0')));
    expect_error([&] { SafetensorsFile f(path); },
                 {path, "'a'", "hold 16 bytes, expected 12", "BF16", "[2, 3]"});
}

TEST(SafetensorsFile, OverlappingTensors) {
    TempDir dir;
    const std::string path = dir.file("t.safetensors");
    const std::string header = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
    write_file(path, safetensors_bytes(header, std::string(16, '\0')));
    expect_error([&] { SafetensorsFile f(path); }, {path, "'a'", "'b'", "overlap", "after 16"});
}

TEST(SafetensorsFile, UnknownDtype) {
    TempDir dir;
    const std::string path = dir.file("t.safetensors");
    const std::string header = R"({"a":{"dtype":"F8_E5M2","shape":[2],"data_offsets":[0,2]}})";
    write_file(path, safetensors_bytes(header, std::string(2, '\0')));
    expect_error([&] { SafetensorsFile f(path); }, {path, "'a'", "unknown dtype", "F8_E5M2"});
}

TEST(SafetensorsFile, BadJson) {
    TempDir dir;
    const std::string path = dir.file("t.safetensors");
    write_file(path, safetensors_bytes(R"({"a": {"dtype": "F32",)", ""));
    expect_error([&] { SafetensorsFile f(path); }, {path, "not valid JSON"});
}

TEST(SafetensorsFile, FileWithNoTensorsIsValid) {
    TempDir dir;
    const std::string path = dir.file("t.safetensors");
    write_file(path, safetensors_bytes("{}", ""));
    EXPECT_TRUE(SafetensorsFile(path).tensors().empty());
}

// Malformations caught by the header parser alone.
void expect_header_error(const std::string& header, size_t data_size,
                         const std::vector<std::string>& parts) {
    std::vector<std::string> all = parts;
    all.push_back("src.safetensors");
    expect_error([&] { parse_safetensors_header(header, data_size, "src.safetensors", nullptr); },
                 all);
}

TEST(SafetensorsHeader, ParsesFieldsAndMetadata) {
    std::map<std::string, std::string> meta{{"stale", "x"}};
    auto infos = parse_safetensors_header(kValidHeader, 16, "src", &meta);
    ASSERT_EQ(infos.size(), 1u);
    const TensorInfo& a = infos.at("a");
    EXPECT_EQ(a.name, "a");
    EXPECT_EQ(a.dtype, DType::F32);
    EXPECT_EQ(a.shape, (Shape{2, 2}));
    EXPECT_EQ(a.begin, 0u);
    EXPECT_EQ(a.end, 16u);
    EXPECT_EQ(meta, (std::map<std::string, std::string>{{"format", "pt"}}));
}

TEST(SafetensorsHeader, NotAnObject) {
    expect_header_error("[1, 2]", 0, {"expected a JSON object"});
}

// Found by the fuzzer in CI: the excerpt of a long string header was cut inside a two-byte UTF-8
// character, and escaping it threw nlohmann's type_error instead of a cpfill::Error.
TEST(SafetensorsHeader, LongStringCutInsideACharacter) {
    const std::string header = "\"" + std::string(63, 'x') + "\xc3\xa9tail\"";
    expect_header_error(header, 0, {"expected a JSON object", std::string(63, 'x') + "..."});
}

TEST(SafetensorsHeader, MissingFields) {
    expect_header_error(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4, {"'a'", "\"dtype\""});
    expect_header_error(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4, {"'a'", "\"shape\""});
    expect_header_error(R"({"a":{"dtype":"F32","shape":[1]}})", 4, {"'a'", "\"data_offsets\""});
    expect_header_error(R"({"a":3})", 4, {"'a'", "expected an object", "3"});
}

TEST(SafetensorsHeader, BadShapes) {
    expect_header_error(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 4,
                        {"'a'", "non-negative integers", "-1"});
    expect_header_error(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4,
                        {"'a'", "1.5"});
    expect_header_error(R"({"a":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8,
                        {"'a'", "expected an array"});
    expect_header_error(
        R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0,
        {"'a'", "overflows"});
    // With a zero dim the tensor is empty, but the other dims must still not overflow.
    expect_header_error(
        R"({"a":{"dtype":"U8","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", 0,
        {"'a'", "overflows"});
}

TEST(SafetensorsHeader, BadOffsets) {
    expect_header_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4,
                        {"'a'", "[begin, end]", "1 elements"});
    expect_header_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8,
                        {"'a'", "begin after end"});
    expect_header_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 8,
                        {"'a'", "non-negative"});
}

TEST(SafetensorsHeader, NonStringMetadata) {
    expect_header_error(R"({"__metadata__":{"format":1}})", 0, {"__metadata__", "format"});
    expect_header_error(R"({"__metadata__":[]})", 0, {"__metadata__", "expected an object"});
}

TEST(SafetensorsHeader, DuplicateTensorName) {
    expect_header_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                        R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                        2, {"'a'", "more than once"});
}

TEST(SafetensorsHeader, EmptyTensorsNeverOverlap) {
    auto infos =
        parse_safetensors_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                 R"("e":{"dtype":"F32","shape":[0,5],"data_offsets":[4,4]}})",
                                 8, "src", nullptr);
    EXPECT_EQ(infos.size(), 2u);
}

TEST(SafetensorsWriter, RejectsDuplicateAndReservedNames) {
    TempDir dir;
    const std::string path = dir.file("t.safetensors");
    Tensor t = iota_f32({1}, 0.0f);
    expect_error([&] { write_safetensors(path, {{"a", t}, {"a", t}}); }, {path, "'a'", "twice"});
    expect_error([&] { write_safetensors(path, {{"__metadata__", t}}); }, {"reserved"});
}

}  // namespace
}  // namespace cpfill
