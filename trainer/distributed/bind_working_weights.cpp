#include "trainer/distributed/bind_working_weights.h"

#include <vector>

namespace sftctl::trainer {

std::shared_ptr<WorkingWeights> BindWorkingWeights(CausalLM& model, const FlatAdamW& optimizer,
                                                   torch::ScalarType dtype, int* bound) {
  TORCH_CHECK(!optimizer.shards_gradients(), "working weights need whole gradient buffers");
  auto working = std::make_shared<WorkingWeights>(optimizer.ParamBuffers(), dtype);
  std::vector<FlatPlace> places;
  // The LM head apart: the loss reads it through its own kernel (chunked_loss.h).
  const void* head = model->LmHeadWeight().data_ptr();
  *bound = 0;
  for (const FlatAdamW::Slot& s : optimizer.Slots()) {
    if (s.param.data_ptr() != head) {
      places.push_back({s.param, static_cast<size_t>(s.group), s.offset});
    } else if (s.param.requires_grad()) {
      model->BindHeadWorkingWeight({working, static_cast<size_t>(s.group), s.offset});
      ++*bound;
    }
  }
  *bound += BindWorkingWeights(*model, working, places);
  return *bound > 0 ? working : nullptr;
}

}  // namespace sftctl::trainer
