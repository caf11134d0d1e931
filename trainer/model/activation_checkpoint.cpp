#include "trainer/model/activation_checkpoint.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "trainer/runtime/device.h"

namespace sftctl::trainer {
namespace {

using torch::Tensor;
using torch::autograd::variable_list;

// The default generators a layer's dropout may draw from (CPU, and `device`'s if it is CUDA)
// with their states at capture time.
struct RngStates {
  std::vector<std::pair<at::Generator, Tensor>> states;

  static RngStates Capture(const torch::Device& device) {
    RngStates r;
    r.Add(at::globalContext().defaultGenerator(torch::kCPU));
    if (device.is_cuda()) r.Add(at::globalContext().defaultGenerator(device));
    return r;
  }
  void Add(at::Generator g) {
    std::lock_guard<std::mutex> lock(g.mutex());
    states.emplace_back(g, g.get_state());
  }
  void Restore() const {
    for (const auto& [g, state] : states) {
      at::Generator gen = g;
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    }
  }
};

// The backward node of one checkpointed call. Its next edges are x's and the trainable
// params', in that order; apply() returns their gradients in the same order.
class CheckpointBackward : public torch::autograd::Node {
 public:
  CheckpointBackward(std::function<Tensor(const Tensor&)> fn, Tensor x, std::vector<Tensor> params,
                     AutocastState autocast, RngStates rng)
      : fn_(std::move(fn)),
        x_(std::move(x)),
        params_(std::move(params)),
        autocast_(autocast),
        rng_(std::move(rng)) {}

  std::string name() const override { return "sftctl::CheckpointBackward"; }

  variable_list apply(variable_list&& grads) override {
    TORCH_CHECK(fn_, "a checkpointed layer was backpropagated twice (retain_graph is not supported)");
    const bool x_grad = x_.requires_grad();
    Tensor x = x_.detach().requires_grad_(x_grad);
    Tensor y;
    {
      // Recompute as the forward ran: its RNG state (restored after) and autocast settings, but
      // without autocast's cast cache: the cache is global, so the bf16 copies of every layer's
      // weights would stay in it until the step ends (each layer uses its weights once, so a
      // cache would save no cast here).
      const RngStates now = RngStates::Capture(x.device());
      rng_.Restore();
      AutocastState uncached = autocast_;
      uncached.cache = false;
      AutocastRestore autocast(uncached);
      at::AutoGradMode enable_grad(true);
      y = fn_(x);
      now.Restore();
    }
    variable_list inputs;
    if (x_grad) inputs.push_back(x);
    inputs.insert(inputs.end(), params_.begin(), params_.end());
    variable_list out(1 + params_.size());
    if (grads[0].defined() && !inputs.empty()) {
      variable_list g = torch::autograd::grad({y}, inputs, {grads[0]}, /*retain_graph=*/false,
                                              /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t i = 0; i < g.size(); ++i) out[x_grad ? i : i + 1] = g[i];
    }
    release_variables();
    return out;
  }

 protected:
  void release_variables() override {
    fn_ = nullptr;
    x_ = Tensor();
    params_.clear();
  }

 private:
  std::function<Tensor(const Tensor&)> fn_;
  Tensor x_;
  std::vector<Tensor> params_;
  AutocastState autocast_;
  RngStates rng_;
};

// A new autograd node as this LibTorch owns them: 1.13 to 2.6 (checked) by std::shared_ptr, deleted
// through torch::autograd::deleteNode (which unlinks a long graph iteratively, not by recursion);
// 2.14 (checked; the newest, which need C++20) by c10::intrusive_ptr, made by c10::make_intrusive,
// with deleteNode gone. Decided by the node's type, not a version: in the shared_ptr branch
// `deleteNode` is an unqualified call on a dependent argument, found (by argument-dependent lookup in
// Node's namespace) only when that branch is instantiated.
template <typename N, typename... Args>
auto MakeNode(Args&&... args) {
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, N>) {
    return c10::make_intrusive<N>(std::forward<Args>(args)...);
  } else {
    return std::shared_ptr<N>(new N(std::forward<Args>(args)...), [](N* node) { deleteNode(node); });
  }
}

}  // namespace

Tensor CheckpointedCall(std::function<Tensor(const Tensor&)> fn, const Tensor& x,
                        const std::vector<Tensor>& params) {
  std::vector<Tensor> trainable;
  for (const auto& p : params) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  if (!torch::GradMode::is_enabled() || (!x.requires_grad() && trainable.empty())) return fn(x);
  const AutocastState autocast = CurrentAutocast();
  RngStates rng = RngStates::Capture(x.device());
  Tensor y;
  {
    torch::NoGradGuard no_grad;
    // Autocast caches casted weights; a cast made here, without grad, would be reused by later
    // recorded forwards and cut their gradient path. No caching while autograd is off.
    AutocastState uncached = autocast;
    uncached.cache = false;
    AutocastRestore no_cache(uncached);
    y = fn(x);
  }
  TORCH_CHECK(y.is_floating_point(), "a checkpointed function must return a floating-point tensor");
  variable_list edges_from = {x};
  edges_from.insert(edges_from.end(), trainable.begin(), trainable.end());
  auto node = MakeNode<CheckpointBackward>(std::move(fn), x.detach().requires_grad_(x.requires_grad()),
                                           trainable, autocast, std::move(rng));
  node->set_next_edges(torch::autograd::collect_next_edges(edges_from));
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace sftctl::trainer
