// Speculative decoding on CUDA (the cases: speculative_cases.h); SKIPPED without a GPU.
#define KILN_SPEC_DEVICE "cuda"
#define KILN_SPEC_SUITE CudaSpeculative
#include "speculative_cases.h"

#ifdef KILN_HAVE_CUDA
#include "kiln/backend/cuda/cuda_backend.h"

// Verifies of uniform shape (every sequence drafted the same count) replay captured graphs, and
// give the tokens of the same verifies run eagerly.
TEST_F(CudaSpeculative, UniformVerifiesReplayGraphsAndMatchEager) {
  auto draft = make_draft_model(*models().self, *models().target);
  auto& be = static_cast<backend::cuda::CudaBackend&>(*models().target->backend);
  auto batch = [&](bool graphs, int64_t* replays) {
    be.set_graphs_enabled(graphs);
    const int64_t r0 = be.stats().graph_replays;
    std::vector<Request> reqs;
    for (int i = 0; i < 4; ++i) reqs.push_back(greedy(kPrompts[i], 80, {}));
    auto out = run(std::move(reqs), draft.get(), 3);
    *replays = be.stats().graph_replays - r0;
    return out;
  };
  int64_t eager_replays = 0, graph_replays = 0;
  const auto eager = batch(false, &eager_replays), graphed = batch(true, &graph_replays);
  be.set_graphs_enabled(true);
  EXPECT_EQ(eager_replays, 0);
  EXPECT_GT(graph_replays, 10);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(graphed[i].tokens, eager[i].tokens) << i;
}
#endif
