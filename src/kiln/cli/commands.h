// The subcommands of `kiln`: each file in cli/ adds one to the app (flags + callback).
// Callbacks throw kiln::Error on bad input; main() prints it on one line and exits 1.
#pragma once
#include <CLI/CLI.hpp>

namespace kiln::cli {

void add_generate(CLI::App& app);
void add_chat(CLI::App& app);
void add_synth(CLI::App& app);
void add_serve(CLI::App& app);
void add_apply_template(CLI::App& app);
void add_convert(CLI::App& app);
void add_perplexity(CLI::App& app);
void add_cache_prompt(CLI::App& app);
void add_pull(CLI::App& app);
void add_upload(CLI::App& app);
void add_evaluate(CLI::App& app);
void add_evals(CLI::App& app);

}  // namespace kiln::cli
