// kiln chat in a pseudo-terminal: two turns, where the second turn's prompt reuses the first
// turn's KV (reported by --verbose), then /reset, after which nothing is reused.
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>

#include "cli_util.h"
#include "kiln/base/json.h"
#include <string>

namespace {

class PtyProcess {
 public:
  explicit PtyProcess(std::vector<std::string> args) {
    pid_ = forkpty(&fd_, nullptr, nullptr, nullptr);
    if (pid_ == 0) {
      std::vector<char*> argv;
      std::string bin = KILN_BIN;
      argv.push_back(bin.data());
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(bin.c_str(), argv.data());
      _exit(127);
    }
  }
  ~PtyProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  void send(const std::string& s) { ASSERT_EQ(write(fd_, s.data(), s.size()), static_cast<ssize_t>(s.size())); }
  // Reads until `pattern` appears in what was read since the last call (or 60 s pass).
  std::string read_until(const std::string& pattern) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (buf_.find(pattern) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 200) <= 0) continue;
      char tmp[4096];
      ssize_t n = read(fd_, tmp, sizeof tmp);
      if (n <= 0) break;
      buf_.append(tmp, n);
    }
    auto at = buf_.find(pattern);
    std::string out = at == std::string::npos ? buf_ : buf_.substr(0, at + pattern.size());
    buf_ = at == std::string::npos ? "" : buf_.substr(at + pattern.size());
    return out;
  }
  int wait_exit() {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string buf_;
};

struct TurnStats {
  int prompt = -1, reused = -1, prefilled = -1;
};
TurnStats parse_stats(const std::string& text) {
  std::smatch m;
  TurnStats s;
  if (std::regex_search(text, m, std::regex(R"(\[prompt: (\d+) tokens, reused (\d+), prefilled (\d+))"))) {
    s.prompt = std::stoi(m[1]);
    s.reused = std::stoi(m[2]);
    s.prefilled = std::stoi(m[3]);
  }
  return s;
}

}  // namespace

TEST(Chat, SecondTurnReusesKvAndResetClearsIt) {
  PtyProcess p({"chat", "--verbose", "--max-tokens", "24"});
  p.read_until(">> ");
  p.send("Once upon a time\n");
  TurnStats t1 = parse_stats(p.read_until(">> "));
  ASSERT_GT(t1.prompt, 0);
  EXPECT_EQ(t1.reused, 0);
  EXPECT_EQ(t1.prefilled, t1.prompt);

  p.send("Lily went to the park\n");
  std::string turn2 = p.read_until(">> ");
  TurnStats t2 = parse_stats(turn2);
  ASSERT_GT(t2.prompt, t1.prompt) << turn2;  // the history is in the prompt
  EXPECT_GT(t2.reused, 0) << turn2;           // ... and its KV was reused
  EXPECT_LT(t2.prefilled, t2.prompt - t1.prompt + 8) << turn2;  // at most the new turn plus one partial block

  p.send("/reset\n");
  EXPECT_NE(p.read_until(">> ").find("[conversation reset]"), std::string::npos);
  p.send("Once upon a time\n");
  TurnStats t3 = parse_stats(p.read_until(">> "));
  EXPECT_EQ(t3.prompt, t1.prompt);  // history gone
  EXPECT_EQ(t3.reused, 0);          // and the cache with it
  p.send("/exit\n");
  EXPECT_EQ(p.wait_exit(), 0);
}

TEST(Chat, CtrlCStopsTheAnswerNotTheProgram) {
  // A random tiny model with a 32k context and no EOS: its answer would run for a long time.
  std::string dir = kiln::test::make_temp_dir("kiln-chat-");
  std::string model = dir + "/tiny";
  ASSERT_EQ(kiln::test::run_kiln({"synth", "--shape", "tiny", "--out", model}).exit_code, 0);
  for (const char* f : {"config.json", "generation_config.json", "tokenizer_config.json"}) {
    auto j = kiln::read_json_file(model + "/" + f);
    j.erase("eos_token_id");
    j.erase("eos_token");
    std::ofstream(model + "/" + f) << j.dump();
  }
  PtyProcess p({"chat", "--model", model, "--max-tokens", "100000"});
  p.read_until(">> ");
  p.send("Once upon a time\n");
  usleep(300 * 1000);
  p.send("\x03");  // the terminal turns ^C into SIGINT
  std::string out = p.read_until(">> ");
  EXPECT_NE(out.find("[stopped]"), std::string::npos) << out;
  p.send("/exit\n");
  EXPECT_EQ(p.wait_exit(), 0);  // the program lived on after the Ctrl-C
  std::filesystem::remove_all(dir);
}
