#include "trainer/generate.h"

#include <algorithm>
#include <map>

namespace sftctl::trainer {

std::vector<std::vector<int32_t>> Generate(CausalLM& model, const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& opts, const DevicePlan& plan,
                                           std::vector<char>* decoded) {
  torch::NoGradGuard no_grad;
  AutocastScope autocast(plan);
  std::vector<std::vector<int32_t>> out(prompts.size());
  std::map<size_t, std::vector<size_t>> by_length;
  for (size_t i = 0; i < prompts.size(); ++i) by_length[prompts[i].size()].push_back(i);
  torch::Generator gen = at::detail::createCPUGenerator(opts.seed);
  const int64_t max_len = model->config().max_position_embeddings;
  if (decoded) decoded->assign(prompts.size(), 0);
  int64_t batch_no = -1;

  for (const auto& [len, rows_all] : by_length) {
    for (size_t start = 0; start < rows_all.size(); start += static_cast<size_t>(opts.batch_size)) {
      if (++batch_no % opts.shard_count != opts.shard_index) continue;
      std::vector<size_t> rows(rows_all.begin() + start,
                               rows_all.begin() + std::min<size_t>(rows_all.size(), start + opts.batch_size));
      if (decoded)
        for (size_t r : rows) (*decoded)[r] = 1;
      const int64_t B = static_cast<int64_t>(rows.size());
      torch::Tensor ids = torch::empty({B, static_cast<int64_t>(len)}, torch::kInt64);
      for (int64_t r = 0; r < B; ++r) {
        const auto& p = prompts[rows[r]];
        for (size_t t = 0; t < len; ++t) ids[r][t] = p[t];
      }
      ids = ids.to(plan.device);
      std::vector<char> done(B, 0);
      int64_t remaining = B;
      for (int64_t k = 0; k < opts.max_new_tokens && remaining > 0 && ids.size(1) < max_len; ++k) {
        torch::Tensor hidden = model->Hidden(ids);
        torch::Tensor logits = model->Logits(hidden.select(1, hidden.size(1) - 1)).to(torch::kFloat32).cpu();
        torch::Tensor next;
        if (opts.temperature <= 0) {
          next = logits.argmax(-1);
        } else {
          next = torch::multinomial(torch::softmax(logits / opts.temperature, -1), 1, false, gen).squeeze(1);
        }
        auto acc = next.accessor<int64_t, 1>();
        for (int64_t r = 0; r < B; ++r) {
          if (done[r]) continue;
          const int32_t tok = static_cast<int32_t>(acc[r]);
          out[rows[r]].push_back(tok);
          if (std::find(opts.stop_ids.begin(), opts.stop_ids.end(), tok) != opts.stop_ids.end()) {
            done[r] = 1;
            --remaining;
          }
        }
        ids = torch::cat({ids, next.to(plan.device).unsqueeze(1)}, 1);
      }
    }
  }
  return out;
}

}  // namespace sftctl::trainer
