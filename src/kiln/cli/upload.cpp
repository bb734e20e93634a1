// kiln upload --path DIR --upload-repo ORG/NAME: mlx_lm.upload's flags (plus --token, --private,
// --revision, --commit-message, --base-model): the folder to a Hub model repo in one commit
// (hub/upload.h), with a generated README.md model card unless the folder has one.
#include <cstdio>

#include "kiln/cli/commands.h"
#include "kiln/hub/upload.h"

namespace kiln::cli {

namespace {

struct UploadArgs {
  hub::UploadOptions opt;
  std::string token;
  bool quiet = false, no_card = false;
};

void run_upload(UploadArgs a) {
  hub::HubConfig cfg = hub::discover_config(a.token);
  cfg.progress = cfg.progress && !a.quiet;
  a.opt.model_card = !a.no_card;
  hub::UploadResult r = hub::upload(a.opt, cfg);
  if (!a.quiet)
    std::fprintf(stderr, "[upload] %s%s: %zu files (%zu LFS, %zu sent now), %.1f MB uploaded%s\n", a.opt.repo.c_str(),
                 r.created_repo ? " (created)" : "", r.files, r.lfs_files, r.lfs_uploaded,
                 static_cast<double>(r.bytes_uploaded) / 1e6, r.generated_card ? ", model card generated" : "");
  std::printf("%s\n", r.commit_url.empty() ? r.commit.c_str() : r.commit_url.c_str());
}

}  // namespace

void add_upload(CLI::App& app) {
  auto a = std::make_shared<UploadArgs>();
  CLI::App* cmd = app.add_subcommand("upload", "Upload a model folder to the Hugging Face Hub (one commit, with a model card)");
  cmd->add_option("--path", a->opt.path, "The folder to upload")->default_val("mlx_model");
  cmd->add_option("--upload-repo", a->opt.repo, "The Hub repo, ORG/NAME (created when it does not exist)")->required();
  cmd->add_option("--token", a->token, "Hub token with write access (default: $HF_TOKEN, then the HF cache's token file)");
  cmd->add_flag("--private", a->opt.private_repo, "Create the repo private (an existing repo keeps its visibility)");
  cmd->add_option("--revision", a->opt.revision, "The branch to commit to (created from main when it does not exist)")->capture_default_str();
  cmd->add_option("--commit-message", a->opt.commit_message, "The commit's summary")->capture_default_str();
  cmd->add_option("--base-model", a->opt.base_model, "The model card's base_model (default: config.json's _name_or_path)");
  cmd->add_flag("--no-model-card", a->no_card, "Do not add a generated README.md when the folder has none");
  cmd->add_flag("--quiet,-q", a->quiet, "No progress, only the commit URL on stdout");
  cmd->callback([a] { run_upload(*a); });
}

}  // namespace kiln::cli
