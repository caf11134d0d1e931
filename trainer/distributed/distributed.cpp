#include "trainer/distributed/distributed.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <type_traits>
#include <utility>

#include "common/os/net_addr.h"

// Torch's CMake targets define USE_C10D_GLOO (and USE_C10D_NCCL in CUDA builds) when LibTorch
// was built with them. A pip wheel (and Debian 13's libtorch-dev without libgloo-dev) defines it
// but ships no gloo headers, which ProcessGroupGloo.hpp includes: Gloo is used only when both hold.
#if defined(USE_C10D_GLOO) && __has_include(<gloo/algorithm.h>)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#define SFTCTL_HAVE_GLOO 1
#else
#define SFTCTL_HAVE_GLOO 0
#endif

// NCCL exists only in CUDA builds of LibTorch that define USE_C10D_NCCL (trainer/CMakeLists.txt
// sets it for CUDA builds); Debian's CPU LibTorch ships the header but not the library.
#if defined(USE_C10D_NCCL) && __has_include(<torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>)
#include <c10/cuda/CUDAFunctions.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define SFTCTL_HAVE_NCCL 1
#else
#define SFTCTL_HAVE_NCCL 0
#endif

namespace sftctl::trainer {
namespace {

// LibTorch 2.0 split the process group into a front end and backends (Gloo, NCCL); the
// collectives we call have the same signatures on both.
#if TORCH_VERSION_MAJOR >= 2
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif

using SteadyClock = std::chrono::steady_clock;

double Since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

std::chrono::milliseconds Millis(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0));
}

template <typename T, typename = void>
struct HasUseLibUv : std::false_type {};
template <typename T>
struct HasUseLibUv<T, std::void_t<decltype(std::declval<T&>().useLibUV)>> : std::true_type {};

// The rendezvous store. Newer LibTorch (2.6 and 2.14 checked) defaults TCPStore to its libuv backend,
// which a LibTorch built without libuv (Debian's 2.14) refuses ("use_libuv was requested but PyTorch was
// built without libuv support"): the store is then made again with the older backend. A template, so
// that `useLibUV` is looked up only where TCPStoreOptions has it (not in 1.13).
template <typename Options>
c10::intrusive_ptr<c10d::TCPStore> MakeTcpStore(const std::string& host, Options opts) {
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, opts);
  } catch (const std::exception& e) {
    if constexpr (HasUseLibUv<Options>::value) {
      if (opts.useLibUV && std::string(e.what()).find("libuv") != std::string::npos) {
        opts.useLibUV = false;
        return c10::make_intrusive<c10d::TCPStore>(host, opts);
      }
    }
    throw;
  }
}

// Not every rank checked in before the timeout (our own error: its message is used as it is).
struct JoinTimeout : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The message of whatever a collective threw, without LibTorch's backtrace.
std::string ExceptionText(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& err) {
    return err.what_without_backtrace();
  } catch (const std::exception& err) {
    return err.what();
  } catch (...) {
    return "unknown exception";
  }
}

StatusOr<int> EnvInt(const std::function<const char*(const char*)>& getenv, const char* name,
                     std::optional<int> fallback, int min_value) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') {
    if (fallback) return *fallback;
    return InvalidArgumentError(std::string("environment variable ") + name +
                                " is required when WORLD_SIZE > 1");
  }
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || n < min_value || n > 1'000'000) {
    return InvalidArgumentError(
        fmt::format("environment variable {}: expected an integer >= {}, got '{}'", name, min_value, v));
  }
  return static_cast<int>(n);
}

}  // namespace

StatusOr<DistEnv> ParseDistEnv(const std::function<const char*(const char*)>& getenv) {
  DistEnv env;
  SFT_ASSIGN_OR_RETURN(env.world_size, EnvInt(getenv, "WORLD_SIZE", 1, 1));
  if (env.world_size == 1) return env;
  SFT_ASSIGN_OR_RETURN(env.rank, EnvInt(getenv, "RANK", std::nullopt, 0));
  if (env.rank >= env.world_size) {
    return InvalidArgumentError(
        fmt::format("environment variable RANK: {} is not below WORLD_SIZE {}", env.rank, env.world_size));
  }
  SFT_ASSIGN_OR_RETURN(env.local_world_size, EnvInt(getenv, "LOCAL_WORLD_SIZE", 1, 1));
  SFT_ASSIGN_OR_RETURN(env.local_rank, EnvInt(getenv, "LOCAL_RANK", 0, 0));
  if (env.local_rank >= env.local_world_size) {
    return InvalidArgumentError(
        fmt::format("environment variable LOCAL_RANK: {} is not below LOCAL_WORLD_SIZE {}", env.local_rank,
                    env.local_world_size));
  }
  const char* addr = getenv("MASTER_ADDR");
  if (addr == nullptr || *addr == '\0')
    return InvalidArgumentError("environment variable MASTER_ADDR is required when WORLD_SIZE > 1");
  env.master_addr = addr;
  SFT_ASSIGN_OR_RETURN(env.master_port, EnvInt(getenv, "MASTER_PORT", std::nullopt, 1));
  if (env.master_port > 65535)
    return InvalidArgumentError(
        fmt::format("environment variable MASTER_PORT: {} is not a port", env.master_port));
  if (const char* ifname = getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr) env.socket_ifname = ifname;
  return env;
}

StatusOr<DistEnv> ReadDistEnv() {
  return ParseDistEnv([](const char* name) { return std::getenv(name); });
}

std::pair<int64_t, int64_t> ShardSlice(int64_t drawn, int64_t per_rank, int rank) {
  const int64_t begin = std::min(drawn, per_rank * rank);
  const int64_t end = std::min(drawn, per_rank * (rank + 1));
  return {begin, end};
}

std::vector<Bucket> AssignBuckets(const std::vector<ParamSlot>& slots, int64_t cap_bytes) {
  const int64_t cap = std::max<int64_t>(1, cap_bytes / static_cast<int64_t>(sizeof(float)));
  int groups = 0;
  for (const auto& s : slots) groups = std::max(groups, s.group + 1);
  std::vector<Bucket> out;
  std::vector<int64_t> newest;  // per bucket: the highest registration index it holds
  for (int g = 0; g < groups; ++g) {
    std::vector<size_t> order;
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i].group == g) order.push_back(i);
    // Reverse registration order (the order backward finishes gradients in).
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return slots[a].index > slots[b].index; });
    Bucket cur;
    auto flush = [&] {
      if (cur.slots.empty()) return;
      int64_t lo = INT64_MAX, hi = 0, top = -1;
      for (size_t i : cur.slots) {
        lo = std::min(lo, slots[i].offset);
        hi = std::max(hi, slots[i].offset + slots[i].numel);
        top = std::max(top, slots[i].index);
      }
      cur.group = g;
      cur.offset = lo;
      cur.numel = hi - lo;
      out.push_back(cur);
      newest.push_back(top);
      cur = Bucket();
    };
    int64_t filled = 0;
    for (size_t i : order) {
      cur.slots.push_back(i);
      filled += slots[i].numel;
      if (filled >= cap) {
        flush();
        filled = 0;
      }
    }
    flush();
  }
  std::vector<size_t> perm(out.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
  std::stable_sort(perm.begin(), perm.end(), [&](size_t a, size_t b) { return newest[a] > newest[b]; });
  std::vector<Bucket> sorted;
  for (size_t i : perm) sorted.push_back(out[i]);
  return sorted;
}

std::string DescribeCommError(const std::string& what) {
  auto has = [&](const char* s) { return what.find(s) != std::string::npos; };
  if (has("closed by peer") || has("reset by peer") || has("Broken pipe") || has("Connection refused") ||
      has("Connection closed") || has("EOF")) {
    return "peer connection closed";
  }
  if (has("imed out") || has("Timeout") || has("timeout")) return "timed out";
  std::string first = what.substr(0, what.find('\n'));
  return first.size() > 200 ? first.substr(0, 200) + "..." : first;
}

// ---------------------------------------------------------------------------------------------
// ProcessGroup

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<Backend> pg;
  Recorder recorder;  // set instead of `pg` by Recording()
#if SFTCTL_HAVE_NCCL
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;  // `pg` when it is NCCL
#endif
};

class ProcessGroup::Pending {
 public:
  c10::intrusive_ptr<c10d::Work> work;  // null for a recording group
  std::vector<at::Tensor> tensors;      // on the group's device; must outlive the operation
  torch::Tensor original;               // the caller's tensor, when `tensors[0]` is a staged copy
  SteadyClock::time_point start = SteadyClock::now();
  std::string launch_error;  // set when the launch itself threw
};

namespace {

#if SFTCTL_HAVE_NCCL
// Makes a dead or hung NCCL peer reach Wait() as an exception on every rank, within the timeout,
// instead of ending the process from one of ProcessGroupNCCL's threads. Read by the
// ProcessGroupNCCL constructor, so set just before it (and overriding the environment: the
// failure contract of distributed.h depends on them).
//  - blocking wait: Work::wait blocks the CPU until the collective is done, fails after the
//    timeout, aborts the communicators and throws;
//  - async error handling off (0, NoHandling): the watchdog's default (TearDown / SkipCleanUp)
//    would end the whole process from its own thread. Blocking wait implies this in the LibTorch
//    versions read, but that is an internal rule; the variable says it outright;
//  - no heartbeat monitor and no flight-recorder dump, which end the process some minutes after
//    a timeout that this trainer already reported.
// LibTorch < 2.2 spells the first NCCL_BLOCKING_WAIT and has neither of the others.
void ConfigureNcclFailureHandling() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  ::setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 1);
  ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0", 1);
  ::setenv("TORCH_NCCL_ENABLE_MONITORING", "0", 1);
  ::setenv("TORCH_NCCL_DUMP_ON_TIMEOUT", "0", 1);
#else
  ::setenv("NCCL_BLOCKING_WAIT", "1", 1);
  ::setenv("NCCL_ASYNC_ERROR_HANDLING", "0", 1);
#endif
}

// Aborts the communicators of a failed group, so that kernels stuck waiting for a dead peer
// stop spinning and the GPU can be used (and the process can exit).
void AbortNccl(const c10::intrusive_ptr<c10d::ProcessGroupNCCL>& nccl) {
  if (!nccl) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  try {
    nccl->abort();
  } catch (...) {
  }
#else
  (void)nccl;  // LibTorch < 2.4: WorkNCCL::wait aborted the communicators before throwing
#endif
}
#endif

bool SameDevice(const torch::Device& tensor, const torch::Device& group) {
  return tensor.type() == group.type() && (!group.has_index() || tensor.index() == group.index());
}

}  // namespace

bool GlooAvailable() { return SFTCTL_HAVE_GLOO; }
bool NcclAvailable() { return SFTCTL_HAVE_NCCL; }

StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Join(const DistEnv& env, const torch::Device& device,
                                                           double timeout_s) {
  if (!device.is_cuda() && !GlooAvailable()) {
    return FailedPreconditionError(
        "multi-rank training on " + device.str() +
        " needs a LibTorch built with Gloo, and this trainer was built without it (pip wheels ship no gloo "
        "headers): train with one rank, or on CUDA GPUs (NCCL)");
  }
  if (device.is_cuda()) {
    const int visible = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
    if (device.index() >= visible) {
      return FailedPreconditionError(fmt::format(
          "multi-rank training on {} (NCCL) needs that GPU, and this rank sees {} CUDA device(s){}",
          device.str(), visible,
          visible == 0
              ? " (no GPU, or a LibTorch that cannot use it: check nvidia-smi and CUDA_VISIBLE_DEVICES)"
              : ""));
    }
  }
  if (device.is_cuda() && !NcclAvailable()) {
    return FailedPreconditionError(
        "multi-rank training on CUDA needs NCCL, and this trainer was built without it (nccl.h was not found "
        "at configure time: install the nvidia-nccl wheel or libnccl-dev and rebuild)");
  }
  std::unique_ptr<ProcessGroup> g(new ProcessGroup());
  g->impl_ = std::make_unique<Impl>();
  g->rank_ = env.rank;
  g->world_size_ = env.world_size;
  g->timeout_s_ = timeout_s;
  g->device_ = device.is_cuda() ? device : torch::Device(torch::kCPU);
  const auto t0 = SteadyClock::now();
  const auto timeout = Millis(timeout_s);
  std::string stage = "the rendezvous store";
  try {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(env.master_port);
    opts.isServer = env.rank == 0;
    opts.numWorkers = static_cast<std::size_t>(env.world_size);
    opts.waitWorkers = false;  // counted below, with an error that says how many arrived
    opts.timeout = timeout;
    g->impl_->store = MakeTcpStore(env.master_addr, opts);
    // Every rank checks in; the last one opens the gate. Bounded by what is left of the timeout.
    stage = "the other ranks";
    const int64_t arrived = g->impl_->store->add("sftctl/joined", 1);
    if (arrived == env.world_size) g->impl_->store->set("sftctl/all-joined", std::vector<uint8_t>{1});
    const auto left =
        std::max(std::chrono::milliseconds(1),
                 timeout - std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - t0));
    try {
      g->impl_->store->wait({"sftctl/all-joined"}, left);
    } catch (...) {
      const int64_t now = g->impl_->store->add("sftctl/joined", 0);
      throw JoinTimeout(fmt::format("timed out: {} of {} ranks arrived", now, env.world_size));
    }
    stage = "the process group";
#if SFTCTL_HAVE_NCCL
    if (device.is_cuda()) {
      ConfigureNcclFailureHandling();
      // The communicator and the caching allocator work on the current device: this rank's GPU.
      if (device.has_index()) c10::cuda::set_device(device.index());
      auto o = c10d::ProcessGroupNCCL::Options::create();
      o->timeout = timeout;  // the watchdog's; Wait() enforces the same bound itself
      g->impl_->nccl =
          c10::make_intrusive<c10d::ProcessGroupNCCL>(g->impl_->store, env.rank, env.world_size, o);
      g->impl_->pg = g->impl_->nccl;
      g->backend_name_ = "nccl";
      return g;
    }
#endif
#if !SFTCTL_HAVE_GLOO
    throw std::logic_error("unreachable: Join checked for Gloo");
#else
    auto o = c10d::ProcessGroupGloo::Options::create(timeout);
    if (!env.socket_ifname.empty()) {
      o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(env.socket_ifname));
    } else if (IsLoopbackHost(env.master_addr)) {
      o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    } else {
      o->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    g->impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(g->impl_->store, env.rank, env.world_size, o);
    g->backend_name_ = "gloo";
#endif
  } catch (...) {
    std::string what = ExceptionText(std::current_exception());
    try {
      throw;
    } catch (const JoinTimeout&) {
    } catch (...) {
      what = DescribeCommError(what);  // LibTorch's or Gloo's text: only its words tell what happened
    }
    g->broken_ = true;
    return UnavailableError(fmt::format(
        "rank {}: cannot join {} at {}:{} within {:.1f} s: {} (are all {} ranks started, and is MASTER_PORT "
        "free on rank 0's host? distributed.timeout_s = {:g})",
        env.rank, stage, env.master_addr, env.master_port, Since(t0), what, env.world_size, timeout_s));
  }
  return g;
}

std::unique_ptr<ProcessGroup> ProcessGroup::Recording(int rank, int world_size, const torch::Device& device,
                                                      Recorder recorder) {
  std::unique_ptr<ProcessGroup> g(new ProcessGroup());
  g->impl_ = std::make_unique<Impl>();
  g->impl_->recorder = std::move(recorder);
  g->rank_ = rank;
  g->world_size_ = world_size;
  g->device_ = device;
  g->backend_name_ = "recording";
  return g;
}

ProcessGroup::~ProcessGroup() {
  if (broken_ && impl_) {
    // A failed collective can leave Gloo's worker threads blocked in a socket (or NCCL's in a
    // kernel), and the backend's destructor joins them: leak it so the process can exit and
    // report the error.
    (void)impl_->pg.release();
#if SFTCTL_HAVE_NCCL
    (void)impl_->nccl.release();
#endif
    (void)impl_->store.release();
    (void)impl_.release();
    return;
  }
#if SFTCTL_HAVE_NCCL && (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4))
  // LibTorch 2.4+ warns when a NCCL group is destroyed without being shut down first.
  if (impl_ && impl_->nccl) {
    try {
      impl_->nccl->shutdown();
    } catch (...) {
    }
  }
#endif
}

torch::Tensor ProcessGroup::Stage(const torch::Tensor& t) const {
  if (SameDevice(t.device(), device_) && t.is_contiguous()) return t;
  return t.to(device_).contiguous();
}

void ProcessGroup::Unstage(torch::Tensor& original, const torch::Tensor& staged) const {
  // A meta device (Recording) has no values to bring back.
  if (staged.unsafeGetTensorImpl() == original.unsafeGetTensorImpl() || staged.is_meta()) return;
  torch::NoGradGuard no_grad;
  original.copy_(staged);
}

Status ProcessGroup::Failed(const std::string& what, double waited_s, const std::string& cause) {
  if (!broken_) {
#if SFTCTL_HAVE_NCCL
    AbortNccl(impl_->nccl);
#endif
  }
  broken_ = true;
  return UnavailableError(
      fmt::format("rank {}: collective {} failed after {:.1f} s: {} (a peer rank died or hung; "
                  "distributed.timeout_s = {:g})",
                  rank_, what, waited_s, cause, timeout_s_));
}

Status ProcessGroup::AwaitRoot(const Status& root_outcome, double timeout_s, const std::string& what,
                               const std::string& timeout_field) {
  const std::string key = "sftctl/root-done/" + std::to_string(awaits_++);
  if (impl_->recorder) {
    impl_->recorder("await", what, torch::empty({0}, torch::TensorOptions().device(device_)));
    return rank_ == 0 ? root_outcome : OkStatus();
  }
  if (rank_ == 0) {
    std::string message = root_outcome.ok() ? "" : root_outcome.message();
    if (!root_outcome.ok() && message.empty()) message = StatusCodeName(root_outcome.code());
    const auto t0 = SteadyClock::now();
    try {
      impl_->store->set(key, std::vector<uint8_t>(message.begin(), message.end()));
      // The store lives in this process, which may exit right after (the final checkpoint, or this
      // error): stay until every rank has read the outcome.
      impl_->store->wait({key + "/read"}, Millis(timeout_s_));
    } catch (...) {
      if (root_outcome.ok())
        return Failed("store (" + what + " done)", Since(t0),
                      DescribeCommError(ExceptionText(std::current_exception())));
    }
    return root_outcome;
  }
  const auto t0 = SteadyClock::now();
  std::vector<uint8_t> message;
  try {
    impl_->store->wait({key}, Millis(timeout_s));
    message = impl_->store->get(key);
    if (impl_->store->add(key + "/readers", 1) == world_size_ - 1)
      impl_->store->set(key + "/read", std::vector<uint8_t>{1});
  } catch (...) {
    broken_ = true;  // rank 0 goes on to collectives this rank will not join
    return UnavailableError(
        fmt::format("rank {}: waited {:.1f} s for rank 0 {}: {} (rank 0 died, or took longer "
                    "than {} = {:g})",
                    rank_, Since(t0), what, DescribeCommError(ExceptionText(std::current_exception())),
                    timeout_field, timeout_s));
  }
  if (message.empty()) return OkStatus();
  return AbortedError(
      fmt::format("rank {}: rank 0 failed {}: {}", rank_, what, std::string(message.begin(), message.end())));
}

std::shared_ptr<ProcessGroup::Pending> ProcessGroup::AllReduceSumAsync(torch::Tensor t,
                                                                       const std::string& what) {
  return LaunchSumAsync(std::move(t), /*root=*/-1, what);
}

std::shared_ptr<ProcessGroup::Pending> ProcessGroup::ReduceSumAsync(torch::Tensor t, int root,
                                                                    const std::string& what) {
  return LaunchSumAsync(std::move(t), root, what);
}

std::shared_ptr<ProcessGroup::Pending> ProcessGroup::LaunchSumAsync(torch::Tensor t, int root,
                                                                    const std::string& what) {
  auto p = std::make_shared<Pending>();
  if (broken_) {
    p->launch_error = "the process group failed earlier";
    return p;
  }
  try {
    torch::Tensor staged = Stage(t);
    if (staged.unsafeGetTensorImpl() != t.unsafeGetTensorImpl()) p->original = t;
    p->tensors = {std::move(staged)};
    if (impl_->recorder) {
      impl_->recorder(root < 0 ? "allreduce" : "reduce", what, p->tensors[0]);
      return p;
    }
    if (root < 0) {
      c10d::AllreduceOptions opts;
      opts.reduceOp = c10d::ReduceOp::SUM;
      opts.timeout = Millis(timeout_s_);
      p->work = impl_->pg->allreduce(p->tensors, opts);
    } else {
      c10d::ReduceOptions opts;
      opts.reduceOp = c10d::ReduceOp::SUM;
      opts.rootRank = root;
      opts.rootTensor = 0;
      opts.timeout = Millis(timeout_s_);
      p->work = impl_->pg->reduce(p->tensors, opts);
    }
  } catch (...) {
    p->launch_error = ExceptionText(std::current_exception());
  }
  return p;
}

Status ProcessGroup::Wait(const std::shared_ptr<Pending>& p, const std::string& what) {
  if (!p->launch_error.empty()) return Failed(what, Since(p->start), DescribeCommError(p->launch_error));
  try {
    // Gloo's own timeout covers a silent peer; the bounded wait enforces it for any backend
    // (NCCL: a blocking wait, ConfigureNcclFailureHandling).
    if (p->work) p->work->wait(Millis(timeout_s_));
    if (p->original.defined()) Unstage(p->original, p->tensors[0]);
  } catch (...) {
    return Failed(what, Since(p->start), DescribeCommError(ExceptionText(std::current_exception())));
  }
  return OkStatus();
}

Status ProcessGroup::AllReduceSum(torch::Tensor& t, const std::string& what) {
  auto p = AllReduceSumAsync(t, what);
  return Wait(p, what);
}

Status ProcessGroup::Broadcast(torch::Tensor& t, int root, const std::string& what) {
  if (broken_) return Failed(what, 0, "the process group failed earlier");
  const auto t0 = SteadyClock::now();
  try {
    std::vector<at::Tensor> tensors = {Stage(t)};
    if (impl_->recorder) {
      impl_->recorder("broadcast", what, tensors[0]);
    } else {
      c10d::BroadcastOptions opts;
      opts.rootRank = root;
      opts.rootTensor = 0;
      opts.timeout = Millis(timeout_s_);
      auto work = impl_->pg->broadcast(tensors, opts);
      work->wait(Millis(timeout_s_));
    }
    Unstage(t, tensors[0]);
  } catch (...) {
    return Failed(what, Since(t0), DescribeCommError(ExceptionText(std::current_exception())));
  }
  return OkStatus();
}

Status ProcessGroup::AllGather(const torch::Tensor& in, std::vector<torch::Tensor>* out,
                               const std::string& what) {
  if (broken_) return Failed(what, 0, "the process group failed earlier");
  const auto t0 = SteadyClock::now();
  try {
    std::vector<at::Tensor> inputs = {Stage(in)};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < world_size_; ++r) outputs[0].push_back(torch::empty_like(inputs[0]));
    if (impl_->recorder) {
      impl_->recorder("allgather", what, inputs[0]);
      for (auto& o : outputs[0]) impl_->recorder("allgather", what, o);
    } else {
      c10d::AllgatherOptions opts;
      opts.timeout = Millis(timeout_s_);
      auto work = impl_->pg->allgather(outputs, inputs, opts);
      work->wait(Millis(timeout_s_));
    }
    out->clear();
    for (const auto& o : outputs[0]) {
      if (impl_->recorder) {
        out->push_back(in.clone());  // this rank's own value for every rank
      } else if (SameDevice(in.device(), device_)) {
        out->push_back(o);
      } else {
        torch::Tensor r = torch::empty_like(in);
        Unstage(r, o);
        out->push_back(r);
      }
    }
  } catch (...) {
    return Failed(what, Since(t0), DescribeCommError(ExceptionText(std::current_exception())));
  }
  return OkStatus();
}

Status ProcessGroup::AllGatherShards(torch::Tensor& padded, int64_t shard, const std::string& what) {
  if (broken_) return Failed(what, 0, "the process group failed earlier");
  const auto t0 = SteadyClock::now();
  try {
    torch::Tensor staged = Stage(padded);
    TORCH_CHECK(staged.dim() == 1 && staged.numel() == shard * world_size_,
                "AllGatherShards: ", staged.numel(), " elements are not ", world_size_, " shards of ", shard);
    torch::Tensor own = staged.narrow(0, rank_ * shard, shard);
    if (impl_->recorder) {
      impl_->recorder("allgather", what, own);
      return OkStatus();  // nothing comes from the other ranks
    }
    c10::intrusive_ptr<c10d::Work> work;
#if SFTCTL_HAVE_NCCL
    if (impl_->nccl) {
      // In place: NCCL reads this rank's input from its own slice of the output.
      c10d::AllgatherOptions opts;
      opts.timeout = Millis(timeout_s_);
      work = impl_->nccl->_allgather_base(staged, own, opts);
    }
#endif
    if (work) {
      work->wait(Millis(timeout_s_));
    } else {
      // Gloo's allgather gathers into a whole-buffer temporary of its own, then copies out: one
      // broadcast per rank, each from its owner into its slice, needs no memory at all.
      std::vector<std::vector<at::Tensor>> slices(world_size_);
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      for (int r = 0; r < world_size_; ++r) {
        slices[r] = {staged.narrow(0, r * shard, shard)};
        c10d::BroadcastOptions b;
        b.rootRank = r;
        b.rootTensor = 0;
        b.timeout = Millis(timeout_s_);
        works.push_back(impl_->pg->broadcast(slices[r], b));
      }
      for (auto& w : works) w->wait(Millis(timeout_s_));
    }
    Unstage(padded, staged);
  } catch (...) {
    return Failed(what, Since(t0), DescribeCommError(ExceptionText(std::current_exception())));
  }
  return OkStatus();
}

Status GatherParameters(ProcessGroup& pg, const FlatAdamW& optimizer) {
  if (!optimizer.sharded()) return OkStatus();
  const auto layouts = optimizer.Layouts();
  auto buffers = optimizer.ParamBuffers();
  for (size_t g = 0; g < buffers.size(); ++g) {
    SFT_RETURN_IF_ERROR(pg.AllGatherShards(buffers[g], layouts[g].shard,
                                           fmt::format("allgather (updated parameters, group {})", g)));
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------
// GradBuckets

GradBuckets::GradBuckets(ProcessGroup* pg, const FlatAdamW& optimizer, double bucket_mb)
    : pg_(pg), grad_buffers_(optimizer.GradBuffers()) {
  const auto slots = optimizer.Slots();
  for (const auto& s : slots) slots_.push_back({s.group, s.offset, s.numel, s.index});
  to_owner_ = optimizer.shards_gradients();
  rank_ = pg->rank();
  layouts_ = optimizer.Layouts();
  if (to_owner_)
    for (const auto& s : slots) params_.push_back(s.param);
  buckets_ = AssignBuckets(slots_, std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1024 * 1024)));
  bucket_of_slot_.assign(slots_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t i : buckets_[b].slots) bucket_of_slot_[i] = b;
  remaining_.assign(buckets_.size(), 0);
  staging_.assign(buckets_.size(), torch::Tensor());
  for (size_t i = 0; i < slots.size(); ++i) {
    // The accumulator's post-hook runs after the gradient was added into .grad (our flat
    // buffer), so the value it sees is final for this backward.
    // (A std::shared_ptr<Node> in LibTorch 1.13-2.6, a c10::intrusive_ptr<Node> in 2.14.)
    auto acc = torch::autograd::impl::grad_accumulator(slots[i].param);
    acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          OnGradReady(i);
          return outputs;
        }));
    accumulators_.push_back(std::make_shared<decltype(acc)>(std::move(acc)));
  }
}

GradBuckets::~GradBuckets() {
  MutexLock lock(&mu_);
  armed_ = false;
}

void GradBuckets::Arm() {
  MutexLock lock(&mu_);
  armed_ = true;
  next_ = 0;
  pending_.clear();
  for (size_t b = 0; b < buckets_.size(); ++b) remaining_[b] = static_cast<int64_t>(buckets_[b].slots.size());
}

void GradBuckets::OnGradReady(size_t slot) {
  MutexLock lock(&mu_);
  if (!armed_) return;
  if (to_owner_) {
    // The gradient moves into the bucket and is freed: autograd makes a new one next time.
    torch::Tensor& grad = params_[slot].mutable_grad();
    const size_t b = bucket_of_slot_[slot];
    if (grad.defined() && buckets_[b].slots.size() == 1 && !staging_[b].defined()) {
      // A parameter that is a bucket of its own (the embedding) is reduced from its gradient.
      staging_[b] = grad.reshape({-1}).contiguous();
      grad = torch::Tensor();
    } else if (grad.defined()) {
      torch::NoGradGuard no_grad;
      const ParamSlot& s = slots_[slot];
      StagingLocked(b).narrow(0, s.offset - buckets_[b].offset, s.numel).add_(grad.reshape({-1}));
      grad = torch::Tensor();
    }
  }
  --remaining_[bucket_of_slot_[slot]];
  LaunchReadyLocked();
}

void GradBuckets::LaunchReadyLocked() {
  while (next_ < buckets_.size() && remaining_[next_] <= 0) {
    if (to_owner_) {
      LaunchToOwnersLocked(next_++);
      continue;
    }
    const Bucket& b = buckets_[next_++];
    pending_.push_back(pg_->AllReduceSumAsync(grad_buffers_[b.group].narrow(0, b.offset, b.numel),
                                              fmt::format("allreduce (gradient bucket {})", next_)));
  }
}

torch::Tensor& GradBuckets::StagingLocked(size_t bucket) {
  if (!staging_[bucket].defined()) {
    const torch::Tensor& like = grad_buffers_[buckets_[bucket].group];
    staging_[bucket] = torch::zeros({buckets_[bucket].numel}, like.options());
  }
  return staging_[bucket];
}

void GradBuckets::LaunchToOwnersLocked(size_t bucket) {
  const Bucket& b = buckets_[bucket];
  const int64_t shard = layouts_[b.group].shard;
  torch::Tensor& staging = StagingLocked(bucket);
  InFlight f{bucket, {}};
  for (int64_t at = b.offset; at < b.offset + b.numel;) {
    const int owner = static_cast<int>(at / shard);
    const int64_t end = std::min(b.offset + b.numel, (owner + 1) * shard);
    f.pieces.push_back(
        pg_->ReduceSumAsync(staging.narrow(0, at - b.offset, end - at), owner,
                            fmt::format("reduce (gradient bucket {} to rank {})", bucket + 1, owner)));
    at = end;
  }
  in_flight_.push_back(std::move(f));
  DrainLocked(kMaxBucketsInFlight);
}

void GradBuckets::DrainLocked(size_t keep) {
  while (in_flight_.size() > keep) {
    InFlight f = std::move(in_flight_.front());
    in_flight_.pop_front();
    const Bucket& b = buckets_[f.bucket];
    for (const auto& p : f.pieces) {
      if (!first_error_.ok()) break;
      first_error_ =
          pg_->Wait(p, fmt::format("reduce (gradient bucket {} of {})", f.bucket + 1, buckets_.size()));
    }
    // This rank's piece: where the bucket overlaps [rank * shard, (rank + 1) * shard).
    const int64_t shard = layouts_[b.group].shard;
    const int64_t lo = std::max(b.offset, rank_ * shard),
                  hi = std::min(b.offset + b.numel, (rank_ + 1) * shard);
    if (first_error_.ok() && lo < hi) {
      torch::NoGradGuard no_grad;
      grad_buffers_[b.group]
          .narrow(0, lo - rank_ * shard, hi - lo)
          .add_(staging_[f.bucket].narrow(0, lo - b.offset, hi - lo));
    }
    staging_[f.bucket] = torch::Tensor();
  }
}

Status GradBuckets::Finish(double* wait_s) {
  std::vector<std::shared_ptr<ProcessGroup::Pending>> pending;
  {
    MutexLock lock(&mu_);
    // A rank whose shard of this window was empty ran no backward and was never armed: it still
    // all-reduces every bucket (its zero gradients), in the same order as the other ranks.
    if (!armed_) {
      next_ = 0;
      pending_.clear();
    }
    // Buckets whose gradients backward never touched (an empty shard, unused parameters) go
    // now, still in bucket order.
    for (auto& r : remaining_) r = 0;
    const auto t_drain = SteadyClock::now();
    LaunchReadyLocked();
    armed_ = false;
    pending.swap(pending_);
    if (to_owner_) {
      DrainLocked(0);
      if (wait_s) *wait_s = Since(t_drain);
      Status st = first_error_;
      first_error_ = OkStatus();
      return st;
    }
  }
  const auto t0 = SteadyClock::now();
  Status status;
  for (size_t b = 0; b < pending.size() && status.ok(); ++b) {
    status =
        pg_->Wait(pending[b], fmt::format("allreduce (gradient bucket {} of {})", b + 1, pending.size()));
  }
  if (wait_s) *wait_s = Since(t0);
  return status;
}

}  // namespace sftctl::trainer
