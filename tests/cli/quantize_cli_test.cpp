// kiln convert + kiln perplexity end to end on stories260K and a real text (Alice in Wonderland):
// the 8-bit folder's perplexity is within 1% of float's, KL(float || quantized) rises as bits fall
// (8 < 4 < 3), the float model against itself has KL 0, and convert refuses an existing --mlx-path.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <regex>

#include "cli_util.h"

namespace fs = std::filesystem;
using kiln::test::run_kiln;

namespace {

const std::string kFloat = std::string(KILN_SHARED_DIR) + "/models/stories260K";
const std::string kText = std::string(KILN_SHARED_DIR) + "/fixtures/text/alice_in_wonderland_gutenberg11.txt";

struct Ppl {
  double ppl = 0, se = 0, kl_mean = -1, kl_p99 = -1;
};

Ppl perplexity(const std::string& model) {
  auto r = run_kiln({"perplexity", "--model", model, "--device", "cpu", "--data-path", kText, "--sequence-length",
                     "128", "--num-samples", "24", "--kl-reference", kFloat});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  Ppl p;
  std::smatch m;
  if (std::regex_search(r.out, m, std::regex(R"(Perplexity: ([0-9.]+) ± ([0-9.]+))"))) {
    p.ppl = std::stod(m[1]);
    p.se = std::stod(m[2]);
  } else {
    ADD_FAILURE() << "no Perplexity line in:\n" << r.out;
  }
  if (std::regex_search(r.out, m, std::regex(R"(mean ([0-9.eE+-]+), p99 ([0-9.eE+-]+))"))) {
    p.kl_mean = std::stod(m[1]);
    p.kl_p99 = std::stod(m[2]);
  } else {
    ADD_FAILURE() << "no KL line in:\n" << r.out;
  }
  return p;
}

}  // namespace

TEST(QuantizeCli, PerplexityAndKlOrderAcrossBitWidths) {
  const std::string dir = kiln::test::make_temp_dir("kiln_qcli");
  std::map<int, Ppl> by_bits;
  for (int bits : {8, 4, 3}) {
    const std::string out = dir + "/q" + std::to_string(bits);
    auto r = run_kiln({"convert", "--hf-path", kFloat, "--mlx-path", out, "-q", "--q-bits", std::to_string(bits),
                       "--q-group-size", "32"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("bits per weight"), std::string::npos) << r.out;
    by_bits[bits] = perplexity(out);
  }
  // --save-eval: the figures printed are the ones kiln_eval.json carries (upload's model card reads it).
  {
    auto r = run_kiln({"perplexity", "--model", dir + "/q4", "--device", "cpu", "--data-path", kText,
                       "--sequence-length", "128", "--num-samples", "24", "--kl-reference", kFloat, "--save-eval"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::ifstream in(dir + "/q4/kiln_eval.json");
    const nlohmann::json ev = nlohmann::json::parse(in);
    EXPECT_NEAR(ev["perplexity"].get<double>(), by_bits[4].ppl, 1e-3 * by_bits[4].ppl);
    EXPECT_NEAR(ev["kl_mean"].get<double>(), by_bits[4].kl_mean, 1e-5 + 1e-5 * by_bits[4].kl_mean);
    EXPECT_EQ(ev["reference"].get<std::string>(), kFloat);
    EXPECT_NE(ev["dataset"].get<std::string>().find("alice"), std::string::npos);
    EXPECT_FALSE(fs::exists(dir + "/q4/kiln_eval.json.tmp"));
    auto embedded = run_kiln({"perplexity", "--data-path", kText, "--save-eval"});
    EXPECT_EQ(embedded.exit_code, 1);
    EXPECT_NE(embedded.err.find("local folder"), std::string::npos) << embedded.err;
  }
  const Ppl f = perplexity(kFloat);
  EXPECT_EQ(f.kl_mean, 0.0);
  EXPECT_GT(f.ppl, 1.0);
  EXPECT_LT(std::fabs(by_bits[8].ppl - f.ppl) / f.ppl, 0.01) << by_bits[8].ppl << " vs float " << f.ppl;
  EXPECT_GT(by_bits[8].kl_mean, 0.0);
  EXPECT_LT(by_bits[8].kl_mean, by_bits[4].kl_mean);
  EXPECT_LT(by_bits[4].kl_mean, by_bits[3].kl_mean);
  EXPECT_GT(by_bits[3].ppl, f.ppl);

  // An existing destination is refused (exit 1, a message naming it), then --force overwrites.
  auto again = run_kiln({"convert", "--hf-path", kFloat, "--mlx-path", dir + "/q8", "-q"});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.err.find("already exists"), std::string::npos) << again.err;
  auto forced = run_kiln({"convert", "--hf-path", kFloat, "--mlx-path", dir + "/q8", "-q", "--q-group-size", "32",
                          "--force"});
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  fs::remove_all(dir);
}
