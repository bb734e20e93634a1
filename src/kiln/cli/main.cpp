// kiln: run, serve, quantize and evaluate LLMs. Subcommands live one per file in cli/.
#include <cstdio>
#include <exception>
#include <string>

#include "kiln/base/error.h"
#include "kiln/base/version.h"
#include "kiln/cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kiln: a local LLM runtime (run, serve, quantize, evaluate)", "kiln"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("kiln ") + kiln::kVersion);
  kiln::cli::add_generate(app);
  kiln::cli::add_chat(app);
  kiln::cli::add_synth(app);
  kiln::cli::add_serve(app);
  kiln::cli::add_apply_template(app);
  kiln::cli::add_convert(app);
  kiln::cli::add_perplexity(app);
  kiln::cli::add_evaluate(app);
  kiln::cli::add_evals(app);
  kiln::cli::add_cache_prompt(app);
  kiln::cli::add_pull(app);
  kiln::cli::add_upload(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const kiln::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kiln: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
