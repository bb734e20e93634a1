// RoPE frequency tables for every scaling type the configs name (HF's rope_init functions):
// default, linear, dynamic (NTK, depends on the current sequence length), llama3, yarn.
#pragma once
#include <vector>

#include "kiln/model/config.h"

namespace kiln::model {

struct RopeTable {
  std::vector<float> inv_freq;  // [rotary_dim / 2]
  float attn_factor = 1.0f;     // multiplies cos and sin (yarn)
};

// head_dim: the attention head size; rotary_dim = head_dim * partial_rotary_factor (even).
// seq_len: the longest sequence in the batch (only "dynamic" uses it).
RopeTable rope_table(const RopeConfig& r, int head_dim, int max_position_embeddings, int seq_len);

}  // namespace kiln::model
