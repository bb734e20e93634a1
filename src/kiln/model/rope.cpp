// RoPE inverse frequencies, computed in double and rounded once, following transformers'
// modeling_rope_utils so that positions rotate by the same angles as the reference.
#include "kiln/model/rope.h"

#include <algorithm>
#include <cmath>

namespace kiln::model {

namespace {

std::vector<double> base_inv_freq(double theta, int rotary_dim) {
  std::vector<double> f(rotary_dim / 2);
  // HF: 1 / base ** (arange(0, dim, 2, int64).float() / dim), in float32.
  for (int i = 0; i < rotary_dim / 2; ++i)
    f[i] = 1.0 / std::pow(theta, static_cast<double>(static_cast<float>(2 * i) / static_cast<float>(rotary_dim)));
  return f;
}

double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

RopeTable rope_table(const RopeConfig& r, int head_dim, int max_position_embeddings, int seq_len) {
  int rotary_dim = static_cast<int>(head_dim * r.partial_rotary_factor);
  rotary_dim -= rotary_dim % 2;
  int64_t orig_max = r.original_max_position_embeddings > 0 ? r.original_max_position_embeddings : max_position_embeddings;
  RopeTable t;
  std::vector<double> inv;
  if (r.type == "default") {
    inv = base_inv_freq(r.theta, rotary_dim);
  } else if (r.type == "linear") {
    inv = base_inv_freq(r.theta, rotary_dim);
    for (auto& f : inv) f /= r.factor;
  } else if (r.type == "dynamic") {
    // NTK-aware: the base grows once the sequence passes the trained length.
    double base = r.theta;
    double len = std::max<double>(seq_len, static_cast<double>(max_position_embeddings));
    if (seq_len > max_position_embeddings)
      base = r.theta * std::pow(r.factor * len / max_position_embeddings - (r.factor - 1.0),
                                static_cast<double>(rotary_dim) / (rotary_dim - 2));
    inv = base_inv_freq(base, rotary_dim);
  } else if (r.type == "llama3") {
    inv = base_inv_freq(r.theta, rotary_dim);
    double low_wavelen = orig_max / r.low_freq_factor, high_wavelen = orig_max / r.high_freq_factor;
    for (auto& f : inv) {
      double wavelen = 2.0 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = f / r.factor;
      } else if (wavelen >= high_wavelen) {  // medium band: interpolate smoothly
        double smooth = (orig_max / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        f = (1.0 - smooth) * f / r.factor + smooth * f;
      }
    }
  } else if (r.type == "yarn") {
    std::vector<double> extra = base_inv_freq(r.theta, rotary_dim);
    double factor = r.factor;
    if (r.mscale && r.mscale_all_dim)
      t.attn_factor = static_cast<float>(yarn_get_mscale(factor, *r.mscale) / yarn_get_mscale(factor, *r.mscale_all_dim));
    else
      t.attn_factor = static_cast<float>(r.attention_factor.value_or(yarn_get_mscale(factor, 1.0)));
    if (r.attention_factor) t.attn_factor = static_cast<float>(*r.attention_factor);
    auto correction_dim = [&](double n_rot) {
      return rotary_dim * std::log(orig_max / (n_rot * 2 * M_PI)) / (2 * std::log(r.theta));
    };
    double low = std::max(0.0, std::floor(correction_dim(r.beta_fast)));
    double high = std::min<double>(rotary_dim - 1, std::ceil(correction_dim(r.beta_slow)));
    if (low == high) high += 0.001;
    inv.resize(extra.size());
    for (size_t i = 0; i < extra.size(); ++i) {
      double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      double extrapolation_weight = 1.0 - ramp;
      inv[i] = extra[i] / factor * (1.0 - extrapolation_weight) + extra[i] * extrapolation_weight;
    }
  }
  t.inv_freq.assign(inv.begin(), inv.end());
  return t;
}

}  // namespace kiln::model
