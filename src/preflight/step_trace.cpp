#include "batchtune/preflight/step_trace.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <fmt/format.h>

#include <cmath>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "batchtune/common/error.h"
#include "batchtune/step/training_step.h"
#include "step/training_snapshot.h"

namespace batchtune {
namespace {

/// Above the emulated device's allocator (priority 100).
constexpr uint8_t kRecorderPriority = 101;

/// A CPU allocator in front of the one installed before it: while recording,
/// every allocation is an event with an id, and its free another.
class RecordingAllocator final : public c10::Allocator {
 public:
  explicit RecordingAllocator(c10::Allocator* inner) : inner_(inner) {}

  static RecordingAllocator& install() {
    // Leaked on purpose: tensors it made may be freed during static destruction.
    static RecordingAllocator* instance = [] {
      auto* r = new RecordingAllocator(c10::GetCPUAllocator());
      current() = r;
      c10::SetCPUAllocator(r, kRecorderPriority);
      return r;
    }();
    return *instance;
  }

  void start() {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.clear();
    events_.reserve(1 << 16);
    next_id_ = 0;
    recording_ = true;
  }
  AllocationTrace stop() {
    std::lock_guard<std::mutex> lock(mutex_);
    recording_ = false;
    return std::move(events_);
  }
  /// Adds an allocation of `bytes` for a storage that exists already (a
  /// parameter), keyed by its data pointer so that its free is recorded.
  int64_t add_existing(const void* data, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t id = next_id_++;
    events_.push_back(AllocationEvent::allocate(id, bytes));
    existing_[data] = id;
    return id;
  }
  /// The id of the live allocation at `data`, or -1.
  int64_t id_of(const void* data) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = ids_.find(data);
    if (it != ids_.end()) return it->second;
    auto e = existing_.find(data);
    return e == existing_.end() ? -1 : e->second;
  }

  c10::DataPtr allocate(size_t bytes) override {
    c10::DataPtr inner = inner_->allocate(bytes);
    void* data = inner.get();
    if (data == nullptr) return inner;  // 0 bytes: nothing to free
    std::lock_guard<std::mutex> lock(mutex_);
    int64_t id = -1;
    if (recording_ && bytes > 0) {
      id = next_id_++;
      events_.push_back(AllocationEvent::allocate(id, static_cast<int64_t>(bytes)));
      ids_[data] = id;
    }
    held_.emplace(data, Held{std::move(inner), id});
    // The context is the data pointer, as LibTorch's raw_allocate expects.
    return {data, data, &free_block, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    inner_->copy_data(dest, src, count);
  }

 private:
  struct Held {
    c10::DataPtr inner;
    int64_t id;
  };

  static void free_block(void* data) { current()->release(data); }
  static RecordingAllocator*& current() {
    static RecordingAllocator* the = nullptr;
    return the;
  }
  void release(void* data) noexcept {
    c10::DataPtr inner;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = held_.find(data);
      if (it == held_.end()) return;
      if (it->second.id >= 0) {
        ids_.erase(data);
        // Within the reserved capacity: a free never allocates mid-step.
        if (recording_) events_.push_back(AllocationEvent::free(it->second.id));
      }
      inner = std::move(it->second.inner);
      held_.erase(it);
    }
    // `inner` goes here, outside the lock: the block back to the allocator below.
  }

  c10::Allocator* inner_;
  mutable std::mutex mutex_;
  bool recording_ = false;
  int64_t next_id_ = 0;
  AllocationTrace events_;
  std::unordered_map<const void*, int64_t> ids_;
  std::unordered_map<const void*, int64_t> existing_;
  std::unordered_map<void*, Held> held_;
};

/// A copy of `batch`, made where it is: inside a recording, the batch's
/// copy on the device.
Batch copy_batch(const Batch& batch) {
  Batch out;
  for (const auto& t : batch.inputs) out.inputs.push_back(t.clone());
  if (batch.target.defined()) out.target = batch.target.clone();
  return out;
}

}  // namespace

StepTrace record_cpu_step(Workload& workload, AmpMode amp, int64_t batch_size) {
  RecordingAllocator& recorder = RecordingAllocator::install();
  const c10::Device cpu(c10::DeviceType::CPU);
  TrainingSnapshot snapshot(workload.model(), workload.optimizer());
  StepTrace out;
  const Batch batch_on_host = workload.synthetic_batch(batch_size);
  recorder.start();
  std::unordered_set<const void*> seen;
  std::vector<int64_t> parameter_ids;
  auto add = [&](const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return;
    const void* data = t.storage().data();
    if (!seen.insert(data).second) return;
    parameter_ids.push_back(
        recorder.add_existing(data, static_cast<int64_t>(t.storage().nbytes())));
  };
  for (const auto& p : workload.model().parameters()) add(p);
  for (const auto& b : workload.model().buffers()) add(b);
  try {
    TrainingStep step(workload, cpu, StepOptions().amp(amp));
    // The batch is made again inside the recording: on a GPU it is a copy
    // on the device.
    Batch batch = copy_batch(batch_on_host);
    step.run(batch);
    step.run(batch);
    batch = Batch();
    std::unordered_set<int64_t> gradient_ids;
    for (const auto& p : workload.model().parameters()) {
      if (p.grad().defined() && p.grad().has_storage()) {
        gradient_ids.insert(recorder.id_of(p.grad().storage().data()));
      }
    }
    // What is live at the end besides the parameters and gradients is the
    // optimizer's state (the step's own tensors are gone).
    out.events = recorder.stop();
    std::unordered_map<int64_t, bool> live;
    for (const auto& e : out.events) {
      if (e.kind == AllocationEvent::Kind::kAllocate) {
        live[e.id] = true;
      } else {
        live.erase(e.id);
      }
    }
    for (const auto& e : out.events) {
      if (e.kind != AllocationEvent::Kind::kAllocate) continue;
      out.category[e.id] = gradient_ids.count(e.id) ? "gradients"
                           : live.count(e.id)       ? "optimizer_state"
                                                    : "activations";
    }
    for (int64_t id : parameter_ids) out.category[id] = "parameters";
  } catch (...) {
    recorder.stop();
    snapshot.restore();
    throw;
  }
  snapshot.restore();
  return out;
}

LinearTrace::LinearTrace(const std::vector<std::pair<int64_t, StepTrace>>& traces) {
  if (traces.size() < 2) throw Error("estimate: a linear trace needs traces at two batches at least");
  const auto& [b1, t1] = traces[0];
  const auto& [b2, t2] = traces[1];
  if (b1 == b2) throw Error(fmt::format("estimate: the traces' batches must differ, got {} twice", b1));
  auto same_shape = [&](const AllocationTrace& a, const AllocationTrace& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].kind != b[i].kind || a[i].id != b[i].id) return false;
    }
    return true;
  };
  for (size_t k = 1; k < traces.size(); ++k) {
    if (!same_shape(t1.events, traces[k].second.events)) {
      throw Error(fmt::format(
          "estimate: the step allocates differently at batch {} ({} events) and {} ({} events): "
          "its size cannot be drawn as a line; estimate it from Python (batchtune.estimate)",
          b1, t1.events.size(), traces[k].first, traces[k].second.events.size()));
    }
  }
  base_ = t1.events;
  category_ = t1.category;
  slope_.resize(base_.size());
  intercept_.resize(base_.size());
  for (size_t i = 0; i < base_.size(); ++i) {
    const double s1 = static_cast<double>(t1.events[i].bytes);
    const double s2 = static_cast<double>(t2.events[i].bytes);
    slope_[i] = (s2 - s1) / static_cast<double>(b2 - b1);
    intercept_[i] = s1 - slope_[i] * static_cast<double>(b1);
    if (traces.size() > 2 && base_[i].kind == AllocationEvent::Kind::kAllocate) {
      const double s3 = static_cast<double>(traces[2].second.events[i].bytes);
      const double line = intercept_[i] + slope_[i] * static_cast<double>(traces[2].first);
      if (std::abs(s3 - line) > 0.5) ++off_line_;
    }
  }
}

AllocationTrace LinearTrace::at(int64_t n) const {
  AllocationTrace out = base_;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].kind != AllocationEvent::Kind::kAllocate) continue;
    const double bytes = intercept_[i] + slope_[i] * static_cast<double>(n);
    out[i].bytes = bytes <= 0 ? 0 : static_cast<int64_t>(std::ceil(bytes));
  }
  return out;
}

}  // namespace batchtune
