// KvCache: the keys and values of every decoder layer for a batch of sequences being generated,
// so that each new token runs the model over that token alone instead of the whole sequence.
//
// Layout. Rows are left-padded: row r holds `left_pad[r]` unused slots, then its prompt, then the
// tokens generated so far; slot s of row r is position s - left_pad[r]. Every layer's K and V are
// [B, Hkv, capacity, D], allocated on the first Append in the projections' dtype and device, and
// filled slot by slot; nothing is copied when the cache grows by a token.
//
// Visibility. A query in slot t sees key slot j when j is a real token of the row (j >= pad),
// j <= t, and, with a sliding window W > 0 (Mistral), t - j < W: the same rule as the training
// path's causal (band) mask, so the cache changes no result. A query in a pad slot sees only
// itself, which keeps its (unused) outputs finite. A model whose layers differ (Gemma: some
// sliding, some full) builds the cache with `full_layers`: mask(false) is then the same rule
// without the window, for its full-attention layers.
//
// Use: Begin(T) before running T new tokens through the layers (it sets positions() and
// mask() for them), Append(layer, k, v) once per layer, End() after the last layer.
// RotaryTables applies RoPE at positions(), so each token gets its own offset.
//
// Thread safety: none; one generation loop owns a cache.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace sftctl::trainer {

// Positions [B, T] and the visibility mask [B, 1, T, S] (bool, true: may attend) of T queries in
// slots q_start.. of left-padded rows (`left_pad`: [B] int64, on the target device) over key
// slots 0..S-1, by the rule above. `window` 0: no sliding window.
std::pair<torch::Tensor, torch::Tensor> LeftPadAttention(const torch::Tensor& left_pad, int64_t q_start,
                                                         int64_t T, int64_t S, int64_t window);

class KvCache {
 public:
  // REQUIRES: capacity >= the longest row's prompt plus the tokens to generate; layers > 0.
  KvCache(int64_t layers, const std::vector<int64_t>& left_pad, int64_t capacity, int64_t window,
          torch::Device device, bool full_layers = false);

  int64_t batch() const { return left_pad_.size(0); }
  int64_t capacity() const { return capacity_; }
  // Slots filled (the same for every row: padding included).
  int64_t length() const { return length_; }

  // Prepares T new tokens in slots length()..length()+T-1. REQUIRES: length() + T <= capacity().
  void Begin(int64_t T);
  // Positions [B, T] (int64) and mask [B, 1, T, length()+T] of the tokens since Begin.
  const torch::Tensor& positions() const { return positions_; }
  // `windowed` false: the mask of a full-attention layer (REQUIRES: built with full_layers, or
  // no window).
  const torch::Tensor& mask(bool windowed = true) const {
    return windowed || window_ == 0 ? mask_ : full_mask_;
  }
  // Stores layer `layer`'s k and v ([B, Hkv, T, D], RoPE applied) in the new slots and returns
  // K and V over all slots so far, [B, Hkv, length()+T, D] (views into the cache).
  std::pair<torch::Tensor, torch::Tensor> Append(int64_t layer, const torch::Tensor& k,
                                                 const torch::Tensor& v);
  // Marks the T tokens as stored.
  void End();

 private:
  std::vector<torch::Tensor> k_, v_;
  torch::Tensor left_pad_;  // [B] int64
  torch::Tensor positions_, mask_, full_mask_;
  int64_t capacity_ = 0, window_ = 0, length_ = 0, pending_ = 0;
  bool full_layers_ = false;
};

}  // namespace sftctl::trainer
