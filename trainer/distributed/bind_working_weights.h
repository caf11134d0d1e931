// Binds a model to bf16 working weights (trainer/model/working_weights.h) over an optimizer's flat
// fp32 parameter buffers (trainer/distributed/optimizer.h): the one place that says which of the
// model's matrices read the working copy.
#pragma once

#include <memory>

#include "trainer/distributed/optimizer.h"
#include "trainer/model/model.h"
#include "trainer/model/working_weights.h"

namespace sftctl::trainer {

// Makes one copy of `optimizer`'s parameter buffers in `dtype` and binds to it every trainable
// projection of `model` (ProjectionImpl::BindWorkingWeight) and its LM head
// (CausalLMImpl::BindHeadWorkingWeight) whose weight the optimizer holds. Returns the copy, null
// when nothing was bound; `*bound` is how many matrices were. Whether to (the device, the
// precision, the ranks) is the caller's decision. REQUIRES: `optimizer` was made over `model`'s
// parameters and keeps whole gradient buffers (!shards_gradients()).
std::shared_ptr<WorkingWeights> BindWorkingWeights(CausalLM& model, const FlatAdamW& optimizer,
                                                   torch::ScalarType dtype, int* bound);

}  // namespace sftctl::trainer
