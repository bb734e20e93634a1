// The named model shapes of `kiln synth` (the same numbers as ../shared/bench/shapes.json;
// a test checks they agree).
#pragma once
#include <string>
#include <vector>

namespace kiln::cli {

struct SynthShape {
  std::string name, model_type;
  int hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, intermediate_size, vocab_size;
  double rope_theta;
  bool tie_word_embeddings = false;
  int head_dim = 0;  // 0: hidden_size / num_attention_heads
};

const std::vector<SynthShape>& synth_shapes();
// Throws [synth] listing the known names when `name` is unknown.
const SynthShape& synth_shape(const std::string& name);

}  // namespace kiln::cli
