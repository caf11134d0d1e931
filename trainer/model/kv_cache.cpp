#include "trainer/model/kv_cache.h"

#include <tuple>

namespace sftctl::trainer {

std::pair<torch::Tensor, torch::Tensor> LeftPadAttention(const torch::Tensor& left_pad, int64_t q_start,
                                                         int64_t T, int64_t S, int64_t window) {
  auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(left_pad.device());
  const torch::Tensor pad = left_pad.view({-1, 1});                     // [B, 1]
  const torch::Tensor q = torch::arange(q_start, q_start + T, i64);     // [T] query slots
  const torch::Tensor positions = (q.unsqueeze(0) - pad).clamp_min(0);  // [B, T]
  const torch::Tensor keys = torch::arange(S, i64);                     // [S] key slots
  const torch::Tensor back = q.view({T, 1}) - keys.view({1, S});        // t - j, [T, S]
  torch::Tensor visible = back.ge(0);
  if (window > 0) visible = visible.logical_and(back.lt(window));
  // [B, T, S]: a real key of the row, by the causal (window) rule, or the query's own slot.
  torch::Tensor real = keys.view({1, 1, S}).ge(pad.view({-1, 1, 1}));
  torch::Tensor mask = visible.unsqueeze(0).logical_and(real).logical_or(back.eq(0).unsqueeze(0));
  return {positions, mask.unsqueeze(1)};
}

KvCache::KvCache(int64_t layers, const std::vector<int64_t>& left_pad, int64_t capacity, int64_t window,
                 torch::Device device, bool full_layers)
    : k_(static_cast<size_t>(layers)),
      v_(static_cast<size_t>(layers)),
      left_pad_(torch::tensor(left_pad, torch::kInt64).to(device)),
      capacity_(capacity),
      window_(window),
      full_layers_(full_layers && window > 0) {}

void KvCache::Begin(int64_t T) {
  TORCH_CHECK(length_ + T <= capacity_, "KV cache full: ", length_, " + ", T, " slots > capacity ",
              capacity_);
  pending_ = T;
  std::tie(positions_, mask_) = LeftPadAttention(left_pad_, length_, T, length_ + T, window_);
  if (full_layers_) full_mask_ = LeftPadAttention(left_pad_, length_, T, length_ + T, 0).second;
}

std::pair<torch::Tensor, torch::Tensor> KvCache::Append(int64_t layer, const torch::Tensor& k,
                                                        const torch::Tensor& v) {
  TORCH_CHECK(k.size(2) == pending_, "KvCache::Append: ", k.size(2), " tokens after Begin(", pending_, ")");
  torch::Tensor& K = k_[static_cast<size_t>(layer)];
  torch::Tensor& V = v_[static_cast<size_t>(layer)];
  if (!K.defined()) {
    K = torch::empty({k.size(0), k.size(1), capacity_, k.size(3)}, k.options());
    V = torch::empty({v.size(0), v.size(1), capacity_, v.size(3)}, v.options());
  }
  K.narrow(2, length_, pending_).copy_(k);
  V.narrow(2, length_, pending_).copy_(v);
  return {K.narrow(2, 0, length_ + pending_), V.narrow(2, 0, length_ + pending_)};
}

void KvCache::End() {
  length_ += pending_;
  pending_ = 0;
}

}  // namespace sftctl::trainer
