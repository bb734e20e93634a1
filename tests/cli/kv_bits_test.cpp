// --kv-bits / --kv-group-size through the binary: the start-up line (bytes per token), bad values
// refused, cache-prompt's quantized files (and --quantized-kv-start) and their refusal by a run of
// another KV layout, perplexity's KL against the float cache, and the flags on every command.
#include <gtest/gtest.h>

#include <filesystem>

#include "cli_util.h"

using kiln::test::run_kiln;
namespace fs = std::filesystem;

static const std::string kStories = std::string(KILN_SHARED_DIR) + "/models/stories260K";

TEST(KvBits, StartUpLineAndOutput) {
  // stories260K: 5 layers x 4 kv heads x head_dim 8 (groups narrowed to 8): per token and layer,
  // K and V of 32 codes + 4 groups x (f16 scale + f16 bias) = 32 + 16 bytes at 8 bits.
  auto r = run_kiln({"generate", "--model", kStories, "--max-tokens", "20", "--temp", "0", "--kv-bits", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("KV cache: 8-bit, groups of 8 (--kv-group-size 64 narrowed to head_dim 8): 480 bytes per token "
                       "(37.5% of the float32 cache's 1280)"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(r.out.empty());
  auto r4 = run_kiln({"generate", "--model", kStories, "--max-tokens", "5", "--kv-bits", "4", "--kv-group-size", "32"});
  ASSERT_EQ(r4.exit_code, 0) << r4.err;
  EXPECT_NE(r4.err.find("4-bit, groups of 8 (--kv-group-size 32 narrowed to head_dim 8): 320 bytes per token"),
            std::string::npos)
      << r4.err;
  auto f = run_kiln({"generate", "--model", kStories, "--max-tokens", "5"});
  EXPECT_EQ(f.err.find("KV cache:"), std::string::npos) << f.err;  // a float run prints nothing new
}

TEST(KvBits, BadValuesAreRefused) {
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--kv-bits", "3"}, {"--kv-bits", "16"},
                                              {"--kv-bits", "8", "--kv-group-size", "48"}}) {
    std::vector<std::string> args = {"generate", "--max-tokens", "2"};
    args.insert(args.end(), bad.begin(), bad.end());
    auto r = run_kiln(args);
    EXPECT_NE(r.exit_code, 0) << bad[1];
    EXPECT_NE(r.err.find(bad.size() > 2 ? "--kv-group-size" : "--kv-bits"), std::string::npos) << r.err;
  }
}

TEST(KvBits, EveryModelCommandTakesTheFlags) {
  for (const char* cmd : {"generate", "chat", "serve", "perplexity", "cache-prompt"}) {
    auto r = run_kiln({cmd, "--help"});
    EXPECT_NE(r.out.find("--kv-bits"), std::string::npos) << cmd;
    EXPECT_NE(r.out.find("--kv-group-size"), std::string::npos) << cmd;
  }
  EXPECT_NE(run_kiln({"cache-prompt", "--help"}).out.find("--quantized-kv-start"), std::string::npos);
}

TEST(KvBits, CachePromptFilesAreQuantizedAndChecked) {
  const std::string dir = kiln::test::make_temp_dir("kiln-kvbits-");
  const std::string prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
                             "park with her friends. One day, she saw a big red ball under a tree.";
  const std::string q8 = dir + "/q8.safetensors", fl = dir + "/f.safetensors";
  auto c = run_kiln({"cache-prompt", "--model", kStories, "-p", prompt, "--prompt-cache-file", q8, "--kv-bits", "8"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  // The same flags continue from it; a float run, or another width, is refused naming both.
  auto ok = run_kiln({"generate", "--model", kStories, "--prompt-cache-file", q8, "--prompt", " Lily", "--max-tokens",
                      "10", "--temp", "0", "--kv-bits", "8"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_FALSE(ok.out.empty());
  auto no = run_kiln({"generate", "--model", kStories, "--prompt-cache-file", q8, "--prompt", " Lily", "--max-tokens", "5"});
  EXPECT_NE(no.exit_code, 0);
  EXPECT_NE(no.err.find("holds K/V quantized to 8 bits in groups of 8 (--kv-bits 8 --kv-group-size 8)"), std::string::npos)
      << no.err;
  EXPECT_NE(no.err.find("this run's KV cache is in float (no --kv-bits)"), std::string::npos) << no.err;
  auto four = run_kiln({"generate", "--model", kStories, "--prompt-cache-file", q8, "--prompt", " Lily", "--max-tokens",
                        "5", "--kv-bits", "4"});
  EXPECT_NE(four.exit_code, 0);
  EXPECT_NE(four.err.find("--kv-bits 4"), std::string::npos) << four.err;
  // --quantized-kv-start past the prompt: the whole cache stays float, and a float run takes it.
  auto s = run_kiln({"cache-prompt", "--model", kStories, "-p", prompt, "--prompt-cache-file", fl, "--kv-bits", "8",
                     "--quantized-kv-start", "5000"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.err.find("fewer than --quantized-kv-start 5000: the cache stays float"), std::string::npos) << s.err;
  auto f = run_kiln({"generate", "--model", kStories, "--prompt-cache-file", fl, "--prompt", " Lily", "--max-tokens", "5"});
  EXPECT_EQ(f.exit_code, 0) << f.err;
  fs::remove_all(dir);
}

TEST(KvBits, PerplexityReportsKlAgainstTheFloatCache) {
  auto r = run_kiln({"perplexity", "--model", kStories, "--kv-bits", "8", "--kl-reference", kStories, "--data-path",
                     std::string(KILN_SHARED_DIR) + "/fixtures/text/alice_in_wonderland_gutenberg11.txt",
                     "--sequence-length", "128", "--num-samples", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.out.find("KL divergence from ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const double kl = std::stod(r.out.substr(r.out.find("mean ", at) + 5));
  EXPECT_GT(kl, 0.0);  // the model runs quantized, the reference float
  EXPECT_LT(kl, 0.01);
}
