// Running the built kiln binary from tests: argv in, exit code + stdout + stderr out.
#pragma once
#include <string>
#include <vector>

namespace kiln::test {

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

// Runs KILN_BIN with args in working directory `cwd` ("" = current), feeding `stdin_text`.
RunResult run_kiln(const std::vector<std::string>& args, const std::string& cwd = "", const std::string& stdin_text = "");
// A fresh empty temporary directory (removed by the OS's tmp cleaning; tests remove their own).
std::string make_temp_dir(const std::string& prefix);

}  // namespace kiln::test
