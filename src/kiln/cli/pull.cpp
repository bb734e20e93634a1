// kiln pull ORG/NAME[@REVISION]: a model repo into the local HF cache (hub/pull.h), laid out as
// huggingface_hub lays it out, so `kiln generate --model ORG/NAME` (and transformers, mlx-lm) find it.
// Prints the snapshot folder on stdout; progress on stderr.
#include <cstdio>

#include "kiln/cli/commands.h"
#include "kiln/hub/pull.h"

namespace kiln::cli {

namespace {

struct PullArgs {
  std::string repo, token, cache_dir, revision;
  std::vector<std::string> include, exclude;
  int max_workers = 8;
  bool quiet = false;
};

void run_pull(const PullArgs& a) {
  hub::RepoRef ref = hub::parse_repo_ref(a.repo);
  if (!a.revision.empty()) ref.revision = a.revision;
  hub::HubConfig cfg = hub::discover_config(a.token, a.cache_dir);
  cfg.max_workers = a.max_workers;
  cfg.progress = cfg.progress && !a.quiet;
  hub::PullOptions opt;
  opt.repo = ref.repo;
  opt.revision = ref.revision;
  opt.include = a.include;
  opt.exclude = a.exclude;
  hub::PullResult r = hub::pull(opt, cfg);
  if (!a.quiet)
    std::fprintf(stderr, "[pull] %s@%s = commit %s: %zu files, %zu downloaded (%.1f MB), %zu already in the cache\n",
                 ref.repo.c_str(), ref.revision.c_str(), r.commit.c_str(), r.files, r.files_downloaded,
                 static_cast<double>(r.bytes_downloaded) / 1e6, r.files - r.files_downloaded);
  std::printf("%s\n", r.snapshot.c_str());
}

}  // namespace

void add_pull(CLI::App& app) {
  auto a = std::make_shared<PullArgs>();
  CLI::App* cmd = app.add_subcommand(
      "pull", "Download a model from the Hugging Face Hub into the local HF cache (resumable; shared with transformers)");
  cmd->add_option("repo", a->repo, "ORG/NAME or ORG/NAME@REVISION (a branch, tag or commit; default main)")->required();
  cmd->add_option("--revision", a->revision, "The branch, tag or commit (overrides @REVISION)");
  cmd->add_option("--include", a->include,
                  "Glob patterns of files to fetch (fnmatch, '*' crosses '/'; default: *.json *.safetensors *.jinja "
                  "tokenizer.model *.tiktoken merges.txt vocab.txt; '*' for everything)");
  cmd->add_option("--exclude", a->exclude, "Glob patterns of files to skip");
  cmd->add_option("--token", a->token, "Hub token (default: $HF_TOKEN, then the HF cache's token file)");
  cmd->add_option("--cache-dir", a->cache_dir, "The HF hub cache (default: $HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub)");
  cmd->add_option("--max-workers", a->max_workers, "Files downloaded at once")->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_flag("--quiet,-q", a->quiet, "No progress, only the snapshot folder on stdout");
  cmd->callback([a] { run_pull(*a); });
}

}  // namespace kiln::cli
