// KV state from the server: kv_out writes the files `cpfill run --kv-out` writes (compared with
// write_kv_state of the engine's own run of the same prompts, tensor by tensor), and return_kv
// returns those files' bytes in base64.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/kv_export.h"
#include "io/safetensors.h"
#include "server_fixture.h"

namespace cpfill::serve {
namespace {

using nlohmann::json;

std::string decode_base64(const std::string& s) {
    const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    uint32_t acc = 0;
    int bits = 0;
    for (char c : s) {
        if (c == '=') break;
        const size_t v = alphabet.find(c);
        EXPECT_NE(v, std::string::npos) << "not base64: " << c;
        acc = acc << 6 | static_cast<uint32_t>(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out += static_cast<char>((acc >> bits) & 0xff);
        }
    }
    return out;
}

std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

TEST(ServerKv, KvOutAndReturnKvHoldTheEngineKvState) {
    test::TestServer srv;
    cpfill::test::TempDir out;
    const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5, 6, 7, 8, 9}, {10, 11, 12}};
    const std::string kv_dir = out.file("kv");
    const json body = {{"input_ids", prompts}, {"kv_out", kv_dir}, {"return_kv", true}};
    auto [st, j] = srv.post("/v1/prefill", body.dump());
    ASSERT_EQ(st, 200) << j.dump();
    EXPECT_EQ(j["kv_out"], kv_dir);

    RunOptions ro;
    ro.keep_kv = true;
    const RunResult ref = test::TinyModel::get().reference->run(prompts, ro);
    write_kv_state(out.file("ref"), ref.out.kv, test::TinyModel::get().cfg);
    const std::vector<std::string> files = kv_state_files(prompts.size());
    for (size_t r = 0; r < prompts.size(); ++r) {
        const std::string served = kv_dir + "/" + files[r];
        SafetensorsFile a(served), b(out.file("ref/" + files[r]));
        ASSERT_EQ(a.tensors().size(), b.tensors().size()) << files[r];
        ASSERT_GT(a.tensors().size(), 0u);
        for (const auto& [name, info] : b.tensors()) {
            ASSERT_TRUE(a.has(name)) << files[r] << ": " << name;
            const Tensor x = a.get(name), y = b.get(name);
            ASSERT_EQ(x.shape(), y.shape()) << name;
            for (int64_t i = 0; i < x.numel(); ++i)
                ASSERT_NEAR(x.f32()[i], y.f32()[i], 1e-4 * (1 + std::abs(y.f32()[i])))
                    << files[r] << " " << name << "[" << i << "]";
        }
        EXPECT_EQ(decode_base64(j["requests"][r]["kv"]), read_bytes(served)) << files[r];
    }
}

TEST(ServerKv, ABadKvOutFolderIs400) {
    test::TestServer srv;
    cpfill::test::TempDir out;
    {
        std::ofstream f(out.file("a-file"));
        f << "x";
    }
    auto [st, j] = srv.post("/v1/prefill",
                            json({{"input_ids", {1, 2}}, {"kv_out", out.file("a-file")}}).dump());
    EXPECT_EQ(st, 400);
    EXPECT_NE(j.dump().find("kv_out"), std::string::npos) << j.dump();
    auto [st2, j2] =
        srv.post("/v1/prefill",
                 json({{"input_ids", {1, 2}}, {"kv_out", test::TinyModel::get().path()}}).dump());
    EXPECT_EQ(st2, 400) << j2.dump();
}

}  // namespace
}  // namespace cpfill::serve
