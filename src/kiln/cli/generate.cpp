// kiln generate (placeholder)
#include "kiln/cli/commands.h"
namespace kiln::cli {
void add_generate(CLI::App& app) { app.add_subcommand("generate", "Generate text"); }
void add_synth(CLI::App& app) { app.add_subcommand("synth", "Write a random model"); }
}
